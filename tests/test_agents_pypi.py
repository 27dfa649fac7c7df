"""The coding agents from PyPI against a real `localinfer serve` on SmolLM2, each in its own venv
(.ci/pyagents installs them into ~/.cache/localinfer-agents/py/NAME; a test skips, saying why, when
its venv is missing): Aider through its OpenAI-compatible provider and through Ollama's wire,
simonw's `llm` with llm-ollama, Mistral's Vibe. One turn each in the agent's non-interactive mode,
the answer capped by the server (-n): a 135M model cannot do agent work, so the protocol is judged
(the agent gets its answer, runs its tool where it does so without asking, exits 0), not the answer."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import run_cli
from test_serve_model import ServeProcess

pytestmark = pytest.mark.slow

AGENTS = Path(os.environ.get("LOCALINFER_AGENTS_DIR", Path.home() / ".cache" / "localinfer-agents")) / "py"


def _agent(name: str, exe: str) -> Path:
    """The agent's program in its venv, or a skip saying where .ci/pyagents would have put it."""
    venv = AGENTS / name
    path = venv / "bin" / exe
    if not (venv / ".pins").exists() or not path.exists():
        pytest.skip(f"{name} is not installed in {venv} (.ci/pyagents installs it with pip)")
    return path


@pytest.fixture(scope="module")
def serve(smollm2_path, tmp_path_factory) -> Iterator[Callable[[], ServeProcess]]:
    """One server for the module, started by the first test whose agent is installed (none: no model
    is loaded): SmolLM2 installed as ``smol``, answers capped at 6 tokens (its answer to Aider ends
    after 12 on some CPUs, 16 or more on others: a cut, and what Aider says of it, on every CPU)."""
    started: list[ServeProcess] = []

    def start() -> ServeProcess:
        if not started:
            home = tmp_path_factory.mktemp("agents-home")
            env = {"LOCALINFER_HOME": str(home), "HF_HUB_OFFLINE": "1"}
            assert run_cli("pull", str(smollm2_path), "--name", "smol", env=env, timeout=180).returncode == 0
            started.append(ServeProcess(Path("smol"), "-n", "6", home=home))
        return started[0]

    yield start
    for s in started:
        s.__exit__(None, None, None)


def _run(exe: Path, args: list[str], tmp_path: Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    """The agent in a project folder of its own, with a home of its own (nothing of the user's read or
    written) and no standard input; our test hooks (PYTHONPATH) are not the agent's."""
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith(("OPENAI_", "OLLAMA_", "MISTRAL_"))}
    return subprocess.run([str(exe), *args], cwd=project, env={**base, "HOME": str(home), **env}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip


def _hello(tmp_path: Path) -> str:
    """A file for the agent to work on, in its project folder."""
    (tmp_path / "project").mkdir(exist_ok=True)
    (tmp_path / "project" / "hello.py").write_text('def hello():\n    return "hi"\n')
    return "hello.py"


def _aider(provider: str, serve: Callable[[], ServeProcess], tmp_path: Path, **env: str) -> str:
    """``aider --message`` in its default mode (``--yes-always`` answers its questions: it makes the
    project a git repository, and applies what the model writes to the file without asking)."""
    exe = _agent("aider", "aider")
    s = serve()
    args = ["--model", f"{provider}/smol", "--message", "Add a docstring to hello", "--yes-always", _hello(tmp_path)]
    proc = _run(exe, args, tmp_path, **{k: v.format(base=s.base) for k, v in env.items()})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the server's 6-token cap cut the answer: Aider says so, after showing what it got
    assert f"Model {provider}/smol has hit a token limit" in proc.stdout, proc.stdout + proc.stderr
    assert not any(bad in proc.stdout for bad in ("litellm.", "BadRequest", "Retrying")), proc.stdout  # no API error, no retry
    return proc.stdout


def test_aider_through_the_openai_provider_gets_its_answer(serve, tmp_path):
    out = _aider("openai", serve, tmp_path, OPENAI_API_BASE="{base}/v1", OPENAI_API_KEY="localinfer")
    assert "Unknown context window" in out  # litellm knows no "smol"; Aider carries on with its defaults


def test_aider_through_ollamas_wire_gets_its_answer_and_the_context(serve, tmp_path):
    """litellm's ollama_chat asks /api/show for the context (Aider shows it) and posts /api/chat
    without a Content-Type (accepted: no Origin, so no browser)."""
    out = _aider("ollama_chat", serve, tmp_path, OLLAMA_API_BASE="{base}")
    assert "Input tokens: ~" in out and "of 8,192" in out, out  # SmolLM2's context, from /api/show


def test_llm_with_llm_ollama_lists_the_model_and_gets_its_answer(serve, tmp_path):
    """llm-ollama registers each model /api/tags lists whose /api/show capabilities have
    ``completion``, as ``ollama/NAME``; the answer streams from /api/chat."""
    exe = _agent("llm", "llm")
    s = serve()
    env = {"OLLAMA_HOST": s.base, "LLM_USER_PATH": str(tmp_path / "llm")}
    listed = _run(exe, ["models", "list"], tmp_path, **env)
    assert listed.returncode == 0 and "ollama/smol" in listed.stdout, listed.stdout + listed.stderr
    proc = _run(exe, ["-m", "ollama/smol", "Say hi"], tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip(), proc.stderr  # the answer, whatever a 135M model says
