"""The commands the README and docs/ show must run as written on a fresh machine: every script
they name exists, and every mpirun with more ranks than a small machine has cores says how to
get past Open MPI's slot check."""
from __future__ import annotations

import re

import pytest

from repo_paths import REPO_ROOT

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
_LAUNCHERS = ("python", "mpirun", "mpiexec", "srun")


def command_lines(text: str) -> list[str]:
    """Shell lines from fenced blocks and inline code spans that start a program."""
    lines = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
        lines.extend(block.replace("\\\n", " ").splitlines())
    lines.extend(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)))
    lines = [re.sub(r"^\s*(export \w+=\S+\s*#.*|#.*)$", "", line).strip() for line in lines]
    return [line for line in lines if line.split(" ", 1)[0] in _LAUNCHERS
            or line.startswith(("NEURAL_ARCH_", "pip "))]


def sections(text: str) -> list[str]:
    return re.split(r"\n(?=#{1,3} )", text)


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_every_script_a_command_names_exists(doc):
    missing = []
    for line in command_lines(doc.read_text()):
        for token in re.findall(r"(?<![\w/.-])([\w./-]+\.py)\b", line):
            if not (REPO_ROOT / token).is_file():
                missing.append(f"{token} in: {line}")
    assert missing == [], f"{doc.name} names scripts that do not exist:\n" + "\n".join(missing)


def test_the_readme_runs_a_real_training_script_everywhere():
    readme = (REPO_ROOT / "README.md").read_text()
    assert " train.py" not in readme
    assert "mpirun -n 4 python examples/train_distributed.py" in readme


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: p.name)
def test_sections_with_mpirun_mention_oversubscribe(doc):
    for section in sections(doc.read_text()):
        if re.search(r"\bmpirun\b[^\n]*\s-n\s+\d", section):
            assert "--oversubscribe" in section, section[:200]
