"""recipes/README.md keeps up with the recipes folder: every recipe file has a section whose
heading names it (a companion such as ``Dockerfile.dockerignore`` is named in its recipe's
section), every section names a file that exists, and every ``python -m neural_arch...`` the
page shows names a module that ``python -m`` can run. No cluster is needed.
"""
from __future__ import annotations

import importlib.util
import re

import pytest

from repo_paths import REPO_ROOT

RECIPES = REPO_ROOT / "recipes"
README = RECIPES / "README.md"
# Files read alongside a recipe rather than run: the BuildKit ignore file <recipe>.dockerignore.
COMPANION_SUFFIXES = (".dockerignore",)


def recipe_files() -> list[str]:
    """Paths under recipes/, relative to it, of the files a section must name."""
    return sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.rglob("*")
                  if p.is_file() and p != README and "__pycache__" not in p.parts
                  and not p.name.startswith(".") and not p.name.endswith(COMPANION_SUFFIXES))


def companion_files() -> list[str]:
    return sorted(p.relative_to(RECIPES).as_posix() for p in RECIPES.rglob("*")
                  if p.is_file() and p.name.endswith(COMPANION_SUFFIXES))


def sections() -> dict[str, str]:
    """Each ``## `` heading's text -> its section's body."""
    parts = re.split(r"^## (.+)$", README.read_text(encoding="utf-8"), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def section_of(relative: str) -> str | None:
    """The body of the section whose heading names ``relative`` as code, or None."""
    for heading, body in sections().items():
        if f"`{relative}`" in heading:
            return body
    return None


def test_the_folder_has_recipes():
    # guards the tests below against passing on an empty list
    assert {"slurm/srun.sbatch", "kubernetes/pytorchjob.yaml",
            "docker/Dockerfile"} <= set(recipe_files())


@pytest.mark.parametrize("recipe", recipe_files())
def test_every_recipe_has_a_section_with_its_command(recipe):
    body = section_of(recipe)
    assert body is not None, f"recipes/README.md has no '## `{recipe}`...' section"
    assert f"recipes/{recipe}" in body, f"the {recipe} section shows no command that uses it"
    assert "```" in body, f"the {recipe} section shows neither a command nor its output"


@pytest.mark.parametrize("companion", companion_files())
def test_every_companion_file_is_named_in_its_recipes_section(companion):
    recipe = companion[:-len(next(s for s in COMPANION_SUFFIXES if companion.endswith(s)))]
    body = section_of(recipe)
    assert body is not None and companion in body, (
        f"{companion} should be named in the section of {recipe}")


def test_every_section_names_an_existing_recipe():
    named = [re.findall(r"`([^`]+)`", heading) for heading in sections()]
    stale = [h for h, paths in zip(sections(), named)
             if not paths or not (RECIPES / paths[0]).is_file()]
    assert stale == [], f"sections whose heading names no file of recipes/: {stale}"


def test_every_python_m_command_names_a_runnable_module():
    modules = sorted(set(re.findall(r"python -m (neural_arch[\w.]*)",
                                    README.read_text(encoding="utf-8"))))
    assert "neural_arch.distributed.env" in modules  # the page's check of each place
    for name in modules:
        spec = importlib.util.find_spec(name)
        assert spec is not None, f"python -m {name}: no such module"
        if spec.submodule_search_locations is not None:  # a package runs its __main__
            assert importlib.util.find_spec(f"{name}.__main__") is not None, (
                f"python -m {name}: a package without __main__")


def test_every_script_and_recipe_path_shown_exists():
    text = README.read_text(encoding="utf-8")
    paths = set(re.findall(r"(?<![\w/.-])((?:recipes|examples|tests)/[\w./-]+\w)", text))
    missing = sorted(p for p in paths if not (REPO_ROOT / p).exists())
    assert missing == [], f"recipes/README.md names paths that do not exist: {missing}"
