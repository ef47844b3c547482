"""Typed config dataclasses: the one source of command-line flags, and plain-dict round trips.

A field declared with `option(...)` carries its flag: name (default `--<field>`),
DALLE-pytorch's spellings as aliases, help, and how a command-line string becomes the
field's type. `add_flags` turns a dataclass into argparse options and `from_args` reads them
back, so a default exists once: the dataclass default is every command's CLI default
(torchtitan generates its CLI the same way). Fields without `option` are set by code (a
tokenizer's vocabulary, a VAE's token map), never typed by a user.

Checkpoints hold configs as plain dicts (loadable with torch.load(weights_only=True));
reading one back ignores keys this version does not know.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, TypeVar

T = TypeVar("T", bound="DictConfig")


@dataclass(frozen=True)
class Flag:
    """How one config field appears on the command line."""

    help: str
    name: str | None = None  # None: --<field name>
    aliases: tuple[str, ...] = ()  # other spellings (DALLE-pytorch's), same meaning
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    parse: Callable[[str], Any] | None = None  # None: the field's own type
    #: how --help shows the default when its value says too little (e.g. None)
    default_text: str | None = None
    #: extra switches that set one value: {"--fp16": "fp16"} beside --precision
    shortcuts: tuple[tuple[str, Any], ...] = ()
    group: str | None = None  # argument group title; None: the caller's group
    required: bool = False  # the command cannot run without it (generate's --dalle_path)

    def option_strings(self, field_name: str) -> list[str]:
        return [self.name or f"--{field_name}", *self.aliases]


def option(default: Any, help: str, **flag: Any) -> Any:
    """A dataclass field that is also a command-line flag (see `Flag` for the keywords)."""
    return dataclasses.field(default=default, metadata={"flag": Flag(help=help, **flag)})


def comma_list(text: str) -> tuple[str, ...]:
    """`full,axial_row` -> ("full", "axial_row"); blanks dropped."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def optional_float(text: str) -> float | None:
    """A float, or none/off for "off" (e.g. --clip_grad_norm none)."""
    if text.lower() in ("none", "off"):
        return None
    return float(text)


def flag_of(field: dataclasses.Field) -> Flag | None:
    return field.metadata.get("flag")


def flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of a config class that are flags, in declaration order."""
    return [f for f in fields(cls) if flag_of(f) is not None]


def _scalar_type(annotation: Any) -> Any:
    """int | None -> int; tuple[str, ...] -> tuple; bool -> bool."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return typing.get_origin(annotation) or annotation


def _shown(value: Any) -> str:
    if isinstance(value, tuple | list):
        return ",".join(str(v) for v in value)
    return str(value)


def add_flags(parser: argparse._ActionsContainer, config: type | Any, *,
              only: Iterable[str] | None = None, exclude: Iterable[str] = (),
              help: Mapping[str, str] | None = None,
              flag_names: Mapping[str, list[str]] | None = None) -> None:
    """Declare the flags of a config class (defaults from the class) or instance (its values).

    `only` / `exclude` choose fields by name; `help` and `flag_names` let a command say what
    a field means there (train-vae's --image_folder is train's --image_text_folder). The
    argparse dest is the field name, so `from_args` needs no mapping.
    """
    cls = config if isinstance(config, type) else type(config)
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in flag_fields(cls)}
    skipped = set(exclude)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for name in (by_name if only is None else only):
        if name in skipped:
            continue
        field = by_name[name]
        spec = flag_of(field)
        assert spec is not None
        target = parser
        if spec.group is not None:
            if spec.group not in groups:
                # argparse shows no group nested in a group: give the parser itself
                assert isinstance(parser, argparse.ArgumentParser), spec.group
                groups[spec.group] = parser.add_argument_group(spec.group)
            target = groups[spec.group]
        default = (getattr(config, name) if not isinstance(config, type)
                   else field.default if field.default is not MISSING else None)
        text = (help or {}).get(name, spec.help)
        kind = _scalar_type(hints[name])
        options = (flag_names or {}).get(name) or spec.option_strings(name)
        kwargs: dict[str, Any] = {"dest": name, "default": default}
        if kind is bool and spec.parse is None:
            kwargs.update(action="store_true", help=text)
        else:
            kwargs["type"] = spec.parse or kind
            if spec.choices is not None:
                kwargs["choices"] = spec.choices
            if spec.metavar or spec.choices is None:
                # argparse would show the dest: --emb_dim CODEBOOK_DIM
                kwargs["metavar"] = spec.metavar or options[0].lstrip("-").upper()
            shown = ("required" if spec.required else
                     spec.default_text or f"default {_shown(default)}").replace("%", "%%")
            kwargs["help"] = f"{text} ({shown})" if text else shown
            if spec.required:
                kwargs["required"] = True
        target.add_argument(*options, **kwargs)
        for switch, value in spec.shortcuts:
            target.add_argument(switch, action="store_const", const=value, dest=name,
                                help=f"same as {options[0]} {value}")


def from_args(cls: type[T], args: argparse.Namespace, **values: Any) -> T:
    """The config the flags describe; `values` sets fields the command computes itself."""
    return cls(**{**flag_values(cls, args), **values})


def flag_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The flag fields of `cls` present in the parsed flags, by field name."""
    return {f.name: getattr(args, f.name) for f in flag_fields(cls) if hasattr(args, f.name)}


class DictConfig:
    """Mixin for frozen dataclasses; tuples become lists in the dict form."""

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v
                for k, v in asdict(self).items()}  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[T], values: dict[str, Any]) -> T:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in values.items() if k in known})


@dataclass(frozen=True)
class JsonOutput:
    """--json, the same switch on every command that reports (check, doctor, plan,
    checkpoint inspect); each command's help says what its object holds."""

    json: bool = option(False, "print one JSON object instead of text")
