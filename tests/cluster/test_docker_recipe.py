"""recipes/docker/Dockerfile, checked without Docker: the image installs extras the project
has, copies what its command needs, and its command is the README's main job, which the
launcher accepts as it would in the image (whose working directory holds the repository).
"""
from __future__ import annotations

import ast
import json
import re
import shlex

from repo_paths import REPO_ROOT

from neural_arch.distributed.launch.args import parse_launcher_args
from neural_arch.distributed.launch.config import LaunchConfig

DOCKER = REPO_ROOT / "recipes" / "docker"
LAUNCHER = ["python", "-m", "neural_arch.distributed.launcher"]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip())
            for ln in joined.splitlines() if ln.strip()]


def setup_extras() -> set[str]:
    """The extras setup.py declares (its ``extras`` dict literal), read without running it."""
    tree = ast.parse((REPO_ROOT / "setup.py").read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(getattr(t, "id", None) == "extras" for t in node.targets)):
            return {ast.literal_eval(k) for k in node.value.keys} | {"all"}
    raise AssertionError("setup.py has no extras dict")


def readme_main_job() -> list[str]:
    """The README's main job: the command after ``pip install -e . &&``."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^pip install -e \. && (python -m neural_arch\.distributed\.launcher .+)$",
                      readme, re.M)
    assert match, "the README's first command changed"
    return shlex.split(match.group(1))


def test_image_installs_existing_extras_on_a_slim_python():
    steps = instructions()
    assert steps[0][0] == "FROM" and re.fullmatch(r"python:3\.\d+-slim", steps[0][1])
    installs = [args for op, args in steps if op == "RUN" and "pip install" in args]
    assert installs, "the image must install the project"
    (requirement,) = re.findall(r'pip install "?\.\[([a-z,]+)\]"?', installs[0])
    extras = set(requirement.split(","))
    assert {"mpi", "fast"} <= extras and extras <= setup_extras()


def test_image_runs_the_readme_main_job(monkeypatch):
    steps = dict((op, args) for op, args in instructions())  # the last of each counts
    command = json.loads(steps["CMD"])  # the exec form: no shell between signals and Python
    assert command == readme_main_job()
    assert steps["COPY"].split() == [".", "."], "the image holds the whole repository"
    assert steps["USER"].isdigit() and steps["USER"] != "0"
    # what the launcher would do with it in the working directory, short of starting workers
    monkeypatch.chdir(REPO_ROOT)
    args = parse_launcher_args(command[len(LAUNCHER):])
    config = LaunchConfig(args.script, args.nproc_per_node, args.nnodes, args.node_rank,
                          args.master_addr, args.master_port, args.backend, args.script_args)
    assert (config.nproc_per_node, config.backend) == (2, "shm")


def test_build_context_keeps_what_the_image_needs():
    ignored = [ln.strip() for ln in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    # setup.py reads README.md; the command runs examples/; pip installs neural_arch/
    for needed in ("setup.py", "README.md", "examples/train_distributed.py",
                   "neural_arch/__init__.py"):
        assert (REPO_ROOT / needed).exists()
        hits = [p for p in ignored if _excludes(p, needed)]
        assert hits == [], f"{needed} would be left out of the image by {hits}"


def _excludes(pattern: str, path: str) -> bool:
    """Whether a .dockerignore ``pattern`` leaves out ``path``: it matches the path or one of
    its folders; ``**/`` spans any folders, ``*`` and ``?`` stay within one name."""
    regex = re.escape(pattern).replace(r"\*\*/", "(?:.*/)?").replace(r"\*", "[^/]*")
    regex = regex.replace(r"\?", "[^/]")
    parts = path.split("/")
    return any(re.fullmatch(regex, "/".join(parts[:n])) for n in range(1, len(parts) + 1))
