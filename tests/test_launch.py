"""`localinfer launch AGENT` on fakes: what each agent is told (--print, the env and args a fake
agent on PATH receives, the private configs), the user's own agent files left byte-identical (or
absent), a missing binary as one line, the agent's exit status passed through, and `stop` stopping
the server launch recorded. The real agents against a real serve: tests/test_launch_agents.py."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import run_cli

URL = "http://127.0.0.1:9"  # --endpoint: nothing is contacted with -m given

FAKE_AGENT = """#!{python}
import json, os, sys
json.dump({{"argv": sys.argv[1:], "env": dict(os.environ)}}, open(os.environ["FAKE_AGENT_OUT"], "w"))
sys.exit(3)
"""

USER_FILES = (".claude/settings.json", ".codex/config.toml", ".config/opencode/opencode.json", ".qwen/settings.json",
              ".config/crush/crush.json", ".local/share/crush/crush.json", ".continue/config.yaml")  # fmt: skip
AGENTS = {"claude": "claude", "codex": "codex", "opencode": "opencode", "qwen": "qwen", "crush": "crush", "continue": "cn"}  # -> binary


@pytest.fixture
def fake_home(tmp_path):
    """A HOME with the agents' own settings in it, and a PATH with fake agents that record what they got."""
    home = tmp_path / "home"
    for rel in USER_FILES:
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_bytes(b'# the user\'s own settings\n{"env": {"ANTHROPIC_BASE_URL": "https://elsewhere"}}\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in AGENTS.values():
        (bin_dir / name).write_text(FAKE_AGENT.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "FAKE_AGENT_OUT": str(tmp_path / "agent.json"), "ANTHROPIC_API_KEY": "sk-the-users-real-key",
           "CLAUDE_CODE_USE_BEDROCK": "1"}  # fmt: skip
    return home, env, tmp_path / "agent.json"


def _snapshot(home: Path) -> dict[str, bytes]:
    return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("agent", list(AGENTS))
def test_the_agent_gets_our_settings_its_args_and_its_exit_status_passes_through(agent, fake_home, isolated_home):
    home, env, out = fake_home
    before = _snapshot(home)
    proc = run_cli("launch", agent, "-m", "smol", "--endpoint", URL + "/v1", "--", "-p", "hi there", env=env, timeout=60)
    assert proc.returncode == 3, proc.stderr.decode()
    got = json.loads(out.read_text())
    assert _snapshot(home) == before  # the user's files byte-identical, and no new one
    sent = got["env"]
    if agent == "claude":
        settings = isolated_home / "launch" / "claude-settings.json"
        assert got["argv"] == ["--settings", str(settings), "-p", "hi there"]
        assert sent["ANTHROPIC_BASE_URL"] == URL and sent["ANTHROPIC_AUTH_TOKEN"] == "localinfer"
        for role in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                     "ANTHROPIC_DEFAULT_OPUS_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"):  # fmt: skip
            assert sent[role] == "smol", role
        for switch in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER"):
            assert sent[switch] == "1"
        assert sent["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0"
        # a CPU's prefill of its ~19k-token default request outlasts its 300 s stream limit
        assert sent["CLAUDE_STREAM_IDLE_TIMEOUT_MS"] == sent["API_TIMEOUT_MS"] == "1800000"
        assert "ANTHROPIC_API_KEY" not in sent and "CLAUDE_CODE_USE_BEDROCK" not in sent  # not sent to a local server
        ours = json.loads(settings.read_text())["env"]  # beats the user's settings.json env (another provider)
        assert ours["ANTHROPIC_BASE_URL"] == URL and ours["CLAUDE_CODE_USE_BEDROCK"] == "0"
        assert oct(settings.stat().st_mode & 0o777) == "0o600"
    elif agent == "codex":
        overrides = [got["argv"][i + 1] for i, a in enumerate(got["argv"][:-2]) if a == "-c"]
        assert got["argv"][-2:] == ["-p", "hi there"] and len(overrides) * 2 == len(got["argv"]) - 2
        assert {'model="smol"', 'model_provider="localinfer"', 'model_providers.localinfer.wire_api="responses"',
                f'model_providers.localinfer.base_url="{URL}/v1"', 'model_providers.localinfer.env_key="LOCALINFER_LAUNCH_KEY"',
                'model_providers.localinfer.name="localinfer"', "model_providers.localinfer.stream_idle_timeout_ms=1800000",
                } <= set(overrides)  # fmt: skip
        assert sent["LOCALINFER_LAUNCH_KEY"] == "localinfer" and "CODEX_HOME" not in sent  # the user's sign-in kept
    elif agent == "qwen":  # a system settings file ranks above the user's; the environment above every file
        settings = Path(sent["QWEN_CODE_SYSTEM_SETTINGS_PATH"])
        assert got["argv"] == ["-p", "hi there"] and settings.parent == isolated_home / "launch"
        config = json.loads(settings.read_text())
        assert config["security"]["auth"]["selectedType"] == "openai" and config["model"]["name"] == "smol"
        assert config["modelProviders"]["openai"] == [{"id": "smol", "name": "smol", "baseUrl": URL + "/v1", "envKey": "LOCALINFER_LAUNCH_KEY"}]
        assert (sent["OPENAI_BASE_URL"], sent["OPENAI_MODEL"], sent["OPENAI_API_KEY"]) == (URL + "/v1", "smol", "localinfer")
    elif agent == "crush":  # its global data file ranks above the user's crush.json, and takes its writes
        config = json.loads((Path(sent["CRUSH_GLOBAL_DATA"]) / "crush.json").read_text())
        assert got["argv"] == ["-p", "hi there"] and Path(sent["CRUSH_GLOBAL_DATA"]).parent == isolated_home / "launch"
        provider = config["providers"]["localinfer"]
        assert provider["type"] == "openai-compat" and provider["base_url"] == URL + "/v1" and provider["api_key"] == "$LOCALINFER_LAUNCH_KEY"
        assert config["models"]["large"] == config["models"]["small"] == {"model": "smol", "provider": "localinfer"}
        assert sent["CRUSH_DISABLE_PROVIDER_AUTO_UPDATE"] == "1" and sent["CRUSH_DISABLE_METRICS"] == "1"
    elif agent == "continue":  # a private CONTINUE_GLOBAL_DIR: ~/.continue is neither read nor written
        home_dir = Path(sent["CONTINUE_GLOBAL_DIR"])
        assert home_dir == isolated_home / "launch" / "continue" and got["argv"] == ["--config", str(home_dir / "config.yaml"), "-p", "hi there"]
        model = json.loads((home_dir / "config.yaml").read_text())["models"][0]  # JSON is YAML
        assert (model["provider"], model["model"], model["apiBase"]) == ("openai", "smol", URL + "/v1")
        assert model["apiKey"] == "${{ secrets.LOCALINFER_LAUNCH_KEY }}" and sent["LOCALINFER_LAUNCH_KEY"] == "localinfer"
    else:
        assert got["argv"] == ["-p", "hi there"]
        config = json.loads(Path(sent["OPENCODE_CONFIG"]).read_text())
        assert Path(sent["OPENCODE_CONFIG"]).parent == isolated_home / "launch"
        provider = config["provider"]["localinfer"]
        assert provider["npm"] == "@ai-sdk/openai-compatible" and provider["options"]["baseURL"] == URL + "/v1"
        assert provider["options"]["apiKey"] == "{env:LOCALINFER_LAUNCH_KEY}" and sent["LOCALINFER_LAUNCH_KEY"] == "localinfer"
        assert config["model"] == "localinfer/smol" and "smol" in provider["models"]


def test_absent_user_files_stay_absent(fake_home, tmp_path):
    home, env, out = fake_home
    for rel in USER_FILES:
        (home / rel).unlink()
    for agent in AGENTS:
        assert run_cli("launch", agent, "-m", "smol", "--endpoint", URL, env=env, timeout=60).returncode == 3
    assert _snapshot(home) == {}


@pytest.mark.parametrize("agent", list(AGENTS))
def test_print_shows_lines_a_shell_can_run_and_runs_nothing(agent, fake_home):
    home, env, out = fake_home
    proc = run_cli("launch", agent, "-m", "smol", "--endpoint", URL, "--print", "--", "exec", "it's", env=env, timeout=60)
    assert proc.returncode == 0 and not out.exists(), proc.stderr.decode()
    text = proc.stdout.decode()
    assert f"at {URL}, model smol" in text.splitlines()[0]
    commands = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert commands[-1].startswith(AGENTS[agent] + " ") and shlex.split(commands[-1])[-2:] == ["exec", "it's"]
    script = "\n".join(commands[:-1]) + "\nenv\n"  # the lines, run by a shell: the variables it exports
    exported = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, check=True).stdout
    if agent == "claude":
        assert f"ANTHROPIC_BASE_URL={URL}\n" in exported and "ANTHROPIC_API_KEY=" not in exported
        assert "# private config (written): " in text and '"ANTHROPIC_MODEL": "smol",' in text
    elif agent == "codex":
        assert "LOCALINFER_LAUNCH_KEY=localinfer\n" in exported and "-c 'model_provider=\"localinfer\"'" in commands[-1]
    elif agent == "opencode":
        assert "OPENCODE_CONFIG=" in exported and '"baseURL": "http://127.0.0.1:9/v1"' in text
    else:
        assert "LOCALINFER_LAUNCH_KEY=localinfer\n" in exported and "# private config (written): " in text


def test_a_missing_agent_is_one_line_naming_its_npm_package(tmp_path):
    env = {"PATH": str(tmp_path)}  # no agent anywhere
    for agent, package in (("claude", "@anthropic-ai/claude-code"), ("codex", "@openai/codex"), ("opencode", "opencode-ai"),
                           ("qwen", "@qwen-code/qwen-code"), ("crush", "@charmland/crush"), ("continue", "@continuedev/cli")):  # fmt: skip
        proc = run_cli("launch", agent, "-m", "smol", "--endpoint", URL, env=env, timeout=60)
        lines = proc.stderr.decode().strip().splitlines()
        assert proc.returncode == 3 and len(lines) == 1 and f"npm install -g {package}" in lines[0], lines
    proc = run_cli("launch", "cursor", env=env, timeout=60)
    assert proc.returncode == 2 and "claude" in proc.stderr.decode()


def test_a_model_file_is_refused_and_a_bad_endpoint_is_a_usage_error(fake_home):
    home, env, out = fake_home
    proc = run_cli("launch", "claude", "-m", "./x.gguf", env=env, timeout=60)
    assert proc.returncode == 2 and "not a file" in proc.stderr.decode()
    proc = run_cli("launch", "claude", "-m", "smol", "--endpoint", "127.0.0.1:8080", env=env, timeout=60)
    assert proc.returncode == 2 and "http://" in proc.stderr.decode()


def test_stop_stops_the_server_launch_recorded_and_never_a_stranger(isolated_home):
    from localinfer.paths import boot_id

    folder = isolated_home / "launch"
    folder.mkdir(parents=True)
    # a stand-in for the server launch started: a process whose command line says `localinfer serve`
    code = "import time; time.sleep(60)"
    serve = subprocess.Popen([sys.executable, "-c", code, "localinfer", "serve"], start_new_session=True)
    stranger = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        record = folder / "server.json"
        record.write_text(json.dumps({"url": URL, "pid": stranger.pid, "boot": boot_id(), "model": "smol"}))
        proc = run_cli("stop", timeout=60)
        assert proc.returncode == 0 and stranger.poll() is None and not record.exists()  # not ours: left alone
        record.write_text(json.dumps({"url": URL, "pid": serve.pid, "boot": boot_id(), "model": "smol"}))
        proc = run_cli("stop", timeout=60)
        assert proc.returncode == 0 and f"pid {serve.pid}" in proc.stderr.decode(), proc.stderr.decode()
        deadline = time.monotonic() + 10
        while serve.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert serve.returncode is not None and not record.exists()
    finally:
        for p in (serve, stranger):
            p.kill()
            p.wait()


def test_the_context_given_is_what_serve_gives_one_sequence_and_a_shortfall_is_said(monkeypatch):
    # launch passed 65,536 (or the trained context) whatever the memory: a big model on a small machine
    # was refused at its load; it now asks serve's own sizing, and says the figures when it is short
    from types import SimpleNamespace

    import localinfer.store
    from localinfer.cli import launch as cli_launch
    from localinfer.system import preflight

    asked: list = []

    def serve_context(info, options, parallel, reserved=0):
        asked.append((info, parallel, reserved))
        return preflight.ServeContext(info.fits, "reduced to fit memory: 1 sequence in 3.0 GB free")

    monkeypatch.setattr(preflight, "serve_context", serve_context)
    monkeypatch.setattr(preflight, "default_cache_ram", lambda: 123)
    warned: list[str] = []
    for fits, said in ((200000, False), (24576, True)):
        resolved = SimpleNamespace(name="big", info=SimpleNamespace(fits=fits))
        monkeypatch.setattr(localinfer.store, "resolve_model", lambda model, **kw: resolved)
        name, ctx = cli_launch._model("big", False, warned.append)
        assert name == "big" and ctx == min(fits, 65536) and asked[-1] == (resolved.info, 1, 123)
        assert bool(warned) == said
    assert warned == ["big gets 24576 tokens of context (reduced to fit memory: 1 sequence in 3.0 GB free); "
                      "agents need 65536: a longer prompt is refused"]


def _told(agent: str, env: dict[str, str]) -> tuple[int, int]:
    """The context and the answer cap an agent was given, from its private config."""
    if agent == "opencode":
        limit = json.loads(Path(env["OPENCODE_CONFIG"]).read_text())["provider"]["localinfer"]["models"]["smol"]["limit"]
        return limit["context"], limit["output"]
    if agent == "qwen":
        settings = json.loads(Path(env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text())
        return settings["modelProviders"]["openai"][0]["generationConfig"]["contextWindowSize"], int(env["QWEN_CODE_MAX_OUTPUT_TOKENS"])
    if agent == "crush":
        model = json.loads((Path(env["CRUSH_GLOBAL_DATA"]) / "crush.json").read_text())["providers"]["localinfer"]["models"][0]
        return model["context_window"], model["default_max_tokens"]
    options = json.loads((Path(env["CONTINUE_GLOBAL_DIR"]) / "config.yaml").read_text())["models"][0]["defaultCompletionOptions"]
    return options["contextLength"], options["maxTokens"]


@pytest.mark.parametrize("agent", ["opencode", "qwen", "crush", "continue"])
def test_the_agents_are_told_the_endpoints_context_and_the_answer_cap(agent, fake_home):
    # OpenCode asks for limit.output as max_tokens (32,000 when it has none: past the context, a 400
    # it answers by compacting forever), Qwen Code 8k then 64k; with --endpoint the context is the server's /props
    import http.server
    import threading

    class Props(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"default_generation_settings": {"n_ctx": 4096}}).encode()
            self.send_response(200 if self.path == "/props?model=smol" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    home, env, out = fake_home
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Props)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for extra, output in (([], 1024), (["-n", "100"], 100)):
            proc = run_cli("launch", agent, "-m", "smol", *extra, "--endpoint", f"http://127.0.0.1:{server.server_port}",
                           env=env, timeout=60)  # fmt: skip
            assert proc.returncode == 3, proc.stderr.decode()
            assert _told(agent, json.loads(out.read_text())["env"]) == (4096, output)
    finally:
        server.shutdown()


@pytest.mark.parametrize(("ctx", "output", "told"), [(65536, None, ("65536", "16384")), (131072, None, ("131072", "32768")),
                                                    (65536, 4096, ("65536", "4096")), (32768, None, None), (None, None, None)])  # fmt: skip
def test_claude_is_told_the_context_where_it_can_compact_in_it(tmp_path, ctx, output, told):
    # Claude Code takes 200k for a model not named claude-*: told the server's context (and an answer
    # cap it keeps room for), it compacts before the server's 400; below ~48k it would compact every
    # turn (its window less the answer's room less 13k is under its own ~21k request), so it is not told
    from localinfer.launch.agents import AGENTS as ALL, setup

    made = setup(ALL["claude"], url=URL, model="m", ctx=ctx, token="t", folder=tmp_path, output=output)  # output: launch's -n
    got = (made.env.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS"), made.env.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS"))
    assert got == (told or (None, None))
    settings = json.loads(next(iter(made.files.values())))["env"]  # the settings file says the same
    assert (settings.get("CLAUDE_CODE_MAX_CONTEXT_TOKENS"), settings.get("CLAUDE_CODE_MAX_OUTPUT_TOKENS")) == got
