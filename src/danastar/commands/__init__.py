"""Command-line front ends of the `danastar` subcommands (argparse), one module each."""
