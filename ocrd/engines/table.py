"""The doors: an engine or a recipe named in the configuration — by its name in the
tables (config/engine.py's ENGINES and RECIPES) or by a class path of one's own,
`package.module:Class` — found and checked to be what it must be."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from ocrd.config.engine import ENGINES, RECIPES
from ocrd.config.settings import ConfigError

if TYPE_CHECKING:
    from ocrd.engines.base import Engine
    from ocrd.engines.recipe import Recipe


def load(path: str, key: str) -> object:
    """The object at `package.module:Name`; ConfigError naming `key` when it cannot be
    imported or is not there."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{key} = {path!r}: cannot import {module_name!r} ({e}); is it "
                          "installed in ocrd's environment?") from None
    try:
        return getattr(module, name)
    except AttributeError:
        raise ConfigError(f"{key} = {path!r}: {module_name!r} has no {name!r}") from None


def engine_class(kind: str) -> type[Engine]:
    """The Engine subclass for `engine.kind` (a name of ENGINES or a class path)."""
    from ocrd.engines.base import Engine

    found = load(ENGINES.get(kind, kind), "engine.kind")
    if not (isinstance(found, type) and issubclass(found, Engine)):
        raise ConfigError(f"engine.kind = {kind!r}: {found!r} is not an ocrd engine (a "
                          "subclass of ocrd.engines.base.Engine)")
    return found


def recipe_class(recipe: str) -> type[Recipe]:
    """The Recipe subclass for `engine.recipe` (a name of RECIPES or a class path)."""
    from ocrd.engines.recipe import Recipe

    found = load(RECIPES.get(recipe, recipe), "engine.recipe")
    if not (isinstance(found, type) and issubclass(found, Recipe)):
        raise ConfigError(f"engine.recipe = {recipe!r}: {found!r} is not a recipe (a "
                          "subclass of ocrd.engines.recipe.Recipe)")
    return found
