"""Every command the docs show in a ```bash block (README.md, docs/*.md) is run, so the docs
and the CLI cannot drift apart. What needs a GPU, a cluster or the network runs in the form
that checks it here:

    vlm-gateway serve ...     with --check (the whole configuration validated, nothing started)
    vlm-gateway launch ...    with --dry-run (the engine command line printed)
    vlm-gateway other ...     as shown (hash-key reads a key from stdin)
    python[3] SCRIPT ...      SCRIPT --help, and every --flag shown must be one it takes
                              (the generators, docgen and build_dashboard, with --check)
    pip install ...           every extra named exists in pyproject.toml, every other
                              package is installed in this environment
    docker compose ...        each --profile exists in docker-compose.yml (and `docker compose
                              config` accepts it where docker is installed)
    kubectl, litellm          the objects and options they name exist

``cat > FILE <<'EOF'`` blocks write FILE for the commands after them; environment setup (cd,
., python3 -m venv) and the test suite itself are not re-run. A command of any other program
fails the test, so a new kind of command gets a check here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SETUP = {"cd", ".", "source"}


def _blocks(path: Path):
    text = path.read_text()
    for m in re.finditer(r"^```(?:bash|sh|shell)\n(.*?)^```", text, re.S | re.M):
        yield text[:m.start()].count("\n") + 2, m.group(1)


def _commands(path: Path):
    """(doc:line, argv or ('write', file, body)) for every command of every bash block."""
    for first, body in _blocks(path):
        lines = body.splitlines()
        i = 0
        while i < len(lines):
            line, where = lines[i], f"{path.name}:{first + i}"
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
            heredoc = re.match(r"\s*cat\s+>\s*(\S+)\s+<<\s*'?(\w+)'?\s*$", line)
            if heredoc:
                end = lines.index(heredoc.group(2), i)
                yield where, ("write", heredoc.group(1), "\n".join(lines[i:end]) + "\n")
                i = end + 1
                continue
            words = shlex.split(line, comments=True)
            cmd: list[str] = []
            for w in words + ["&&"]:
                if w in ("&&", ";", "&", "||"):
                    if cmd:
                        yield where, cmd
                    cmd = []
                else:
                    cmd.append(w)


ALL = [(where, cmd) for doc in DOCS for where, cmd in _commands(doc)]


def test_the_docs_show_commands():
    shown = " ".join(" ".join(c) if isinstance(c, list) else "" for _, c in ALL)
    for needed in ("vlm-gateway serve", "vlm-gateway launch", "pip install", "docker compose"):
        assert needed in shown, needed


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory that looks like the checkout (files the commands write stay out of it)."""
    d = tmp_path_factory.mktemp("docs-commands")
    for entry in ROOT.iterdir():
        if entry.name not in (".git",):
            (d / entry.name).symlink_to(entry)
    return d


def _env(assignments: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLM_GATEWAY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return {**env, **assignments}


def _run(argv: list[str], cwd: Path, env: dict, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=120)


def _check_vlm_gateway(args: list[str], cwd: Path, env: dict) -> str:
    sub = args[0] if args else ""
    stdin = ""
    if sub == "serve":
        args = [*args, "--check"]
    elif sub == "launch":
        args = args if "--dry-run" in args else [*args, "--dry-run"]
    elif sub == "hash-key":
        stdin = "a-key-from-the-docs\n"
    elif sub == "sim":
        args = [*args, "--help"]  # it would serve until stopped
    r = _run([sys.executable, "-m", "vlm_gateway", *args], cwd, env, stdin)
    assert r.returncode == 0, r.stderr
    if sub == "hash-key":
        assert re.fullmatch(r"[0-9a-f]{64}\n", r.stdout)
    if sub == "launch":
        assert r.stdout.strip().splitlines()[-1].split()[0] in ("vllm", "trtllm-serve"), r.stdout
    return r.stdout


def _check_python(args: list[str], cwd: Path, env: dict) -> None:
    if args[:2] == ["-m", "venv"]:
        return
    if args[:2] == ["-m", "pytest"]:
        return  # the test suite itself: this test is part of it
    if args[:2] == ["-m", "vlm_gateway.docgen"] or args[:1] == ["grafana/build_dashboard.py"] or \
            args[:1] == ["benchmarks/collect_docs.py"]:
        r = _run([sys.executable, *args, "--check"], cwd, env)
        assert r.returncode == 0, r.stderr
        return
    script = args[0]
    assert (cwd / script).is_file(), f"no {script}"
    r = _run([sys.executable, script, "--help"], cwd, env)
    assert r.returncode == 0, r.stderr
    for flag in (a.split("=")[0] for a in args[1:] if a.startswith("--")):
        assert flag in r.stdout, f"{script} has no option {flag}"


def _check_pip(args: list[str]) -> None:
    assert args[0] == "install", args
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for a in args[1:]:
        if a.startswith("-"):
            continue
        m = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", a)
        if m:
            for extra in filter(None, (m.group(1) or "").split(",")):
                assert extra in extras, f"pyproject.toml has no extra {extra!r}"
            continue
        name = re.split(r"[<>=!\[]", a)[0]
        metadata.version(name)  # installed here, so it is a real package


def _check_docker_compose(args: list[str], cwd: Path, env: dict) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    profiles = {p for s in compose["services"].values() for p in s.get("profiles", [])}
    shown = [args[i + 1] for i, a in enumerate(args) if a == "--profile"]
    assert shown and set(shown) <= profiles, (shown, profiles)
    if shutil.which("docker") and _run(["docker", "compose", "version"], cwd, env).returncode == 0:
        r = _run(["docker", "compose", *[x for p in shown for x in ("--profile", p)], "config", "-q"], cwd, env)
        assert r.returncode == 0, r.stderr


def _check_kubectl(args: list[str]) -> None:
    manifests = " ".join(p.read_text() for p in (ROOT / "deploy").rglob("*.yaml"))
    if args[2:5] == ["create", "secret", "generic"]:
        assert args[5] in manifests, f"the manifests do not use the secret {args[5]}"
    else:
        pytest.fail(f"no check for kubectl {' '.join(args)}")


def _check_litellm(args: list[str], env: dict) -> None:
    exe = shutil.which("litellm") or str(Path(sys.executable).parent / "litellm")
    if not os.path.exists(exe):
        pytest.skip("litellm is not installed here (.ci/run installs it)")
    flags = [a for a in args if a.startswith("--")]
    r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    for f in flags:
        assert f in r.stdout, f


@pytest.mark.parametrize("where, cmd", ALL, ids=[f"{w} {' '.join(c) if isinstance(c, list) else c[1]}"[:90]
                                                 for w, c in ALL])
def test_documented_command_runs(where, cmd, workdir):
    if isinstance(cmd, tuple):  # a file the next commands read
        _, name, body = cmd
        (workdir / name).unlink(missing_ok=True)
        (workdir / name).write_text(body)
        return
    assignments = {}
    while cmd and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", cmd[0]):
        k, _, v = cmd.pop(0).partition("=")
        assignments[k] = v
    env = _env(assignments)
    prog, args = cmd[0], cmd[1:]
    if prog in SETUP:
        return
    if prog == "vlm-gateway":
        _check_vlm_gateway(args, workdir, env)
    elif prog in ("python", "python3"):
        _check_python(args, workdir, env)
    elif prog == "pip":
        _check_pip(args)
    elif prog == "docker" and args[:1] == ["compose"]:
        _check_docker_compose(args[1:], workdir, env)
    elif prog == "kubectl":
        _check_kubectl(args)
    elif prog == "litellm":
        _check_litellm(args, env)
    else:
        pytest.fail(f"{where}: no check for the documented command {shlex.join(cmd)}")


def test_the_default_install_and_the_image_carry_video():
    """The quick start's `pip install -e .` and the Dockerfile's install bring PyAV."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(re.match(r"av\b", d) for d in deps), deps
    docker = (ROOT / "Dockerfile").read_text()
    assert re.search(r"pip install '\.(\[[\w,]*\])?'", docker)
    assert re.search(r"^pip install -e \.$", (ROOT / "README.md").read_text(), re.M)


def test_no_benchmark_page_names_a_path_of_the_machine_it_ran_on():
    r = subprocess.run([sys.executable, "benchmarks/collect_docs.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import collect_docs
    assert collect_docs.machine_local("BENCHMARKS.md", (ROOT / "docs" / "BENCHMARKS.md").read_text()) == []
