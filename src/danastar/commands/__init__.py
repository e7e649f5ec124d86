"""The command-line front ends: each module parses its arguments and calls the packages it
drives; `danastar.cli` dispatches `danastar <command>` to `commands.<command>.main(argv)`."""
