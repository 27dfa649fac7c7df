"""What each agent is told to use a local `serve`: environment variables, flags before the user's
own arguments, and private config files in our data folder. The user's own settings
(``~/.claude/settings.json``, ``~/.codex/config.toml``, ``~/.config/opencode/opencode.json``,
``~/.qwen/settings.json``, ``~/.config/crush/crush.json``, ``~/.continue/config.yaml``) are never
read nor written by us: what we set wins over them through each agent's documented precedence.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

AGENT_CTX = 65536  # what agents need: Claude Code's prompt alone is ~20k tokens with its tools
KEY_VAR = "LOCALINFER_LAUNCH_KEY"  # Codex and OpenCode read the key from it (never the user's OPENAI_API_KEY)
# Codex and Claude Code drop a stream silent for 5 min (their defaults; Claude Code's `ping` events do
# not count) and send the request again: a long prompt's prefill on a CPU can take longer than that
# before the first token (Claude Code's default mode, ~19k tokens on SmolLM2 at -t 2: 303 s)
STREAM_IDLE_MS = 30 * 60 * 1000


def output_cap(ctx: int) -> int:
    """An answer's tokens when the agent names no limit: Codex never does, and a model that does not
    stop would write until the context is full (at CPU speed, most of an hour) to no one's use."""
    return max(256, ctx // 4)


@dataclass(frozen=True)
class Agent:
    name: str  # what `launch` takes
    title: str
    binary: str  # looked up on PATH
    package: str  # npm's


AGENTS = {a.name: a for a in (
    Agent("claude", "Claude Code", "claude", "@anthropic-ai/claude-code"),
    Agent("codex", "Codex CLI", "codex", "@openai/codex"),
    Agent("opencode", "OpenCode", "opencode", "opencode-ai"),
    Agent("qwen", "Qwen Code", "qwen", "@qwen-code/qwen-code"),
    Agent("crush", "Crush", "crush", "@charmland/crush"),
    Agent("continue", "Continue CLI", "cn", "@continuedev/cli"),
)}  # fmt: skip


@dataclass
class AgentSetup:
    """How one agent is started: ``env`` set, ``unset`` removed, ``args`` before the user's, and
    ``files`` (path -> text) written first, in our data folder."""

    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    args: list[str] = field(default_factory=list)
    files: dict[Path, str] = field(default_factory=dict)


def setup(agent: Agent, *, url: str, model: str, ctx: int | None, token: str, folder: Path, output: int | None = None) -> AgentSetup:
    """``url``: the server's root (no /v1); ``ctx``: the model's context (None: unknown); ``output``:
    the answer's cap where the agent asks for one (None: ``output_cap``);
    ``folder``: where the private configs go."""
    cap = min(output or output_cap(ctx), ctx // 2) if ctx else output  # what the agent asks for as max_tokens
    if agent.name == "claude":
        return _claude(url, model, ctx, token, folder, cap)
    if agent.name == "codex":
        return _codex(url, model, ctx, token, folder)
    return {"opencode": _opencode, "qwen": _qwen, "crush": _crush, "continue": _continue}[agent.name](url, model, ctx, token, folder, cap)


def _claude(url: str, model: str, ctx: int | None, token: str, folder: Path, cap: int | None) -> AgentSetup:
    env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_AUTH_TOKEN": token}
    for role in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                 "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL"):  # fmt: skip
        env[role] = model  # every role: a background call for a model not served would be a 404
    env.update({
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no look-ups at api.anthropic.com, no title request
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
        # the billing header's per-request hash changes the system prompt, so no prefix cache would ever hit
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        # its stream's idle limit (it takes the larger of this and 300 s), and a request's whole time
        # (default 600 s), which its non-streamed retry of a dropped stream waits out
        "CLAUDE_STREAM_IDLE_TIMEOUT_MS": str(STREAM_IDLE_MS), "API_TIMEOUT_MS": str(STREAM_IDLE_MS),
    })  # fmt: skip
    if ctx and cap:
        env.update(_claude_window(ctx, cap))
    # A settings file's env beats the process's: the user's settings.json may name another provider.
    # Ours, given with --settings, beats theirs (Claude Code: command-line settings over user settings).
    overrides = {**env, "CLAUDE_CODE_USE_BEDROCK": "0", "CLAUDE_CODE_USE_VERTEX": "0", "CLAUDE_CODE_USE_FOUNDRY": "0"}
    settings = folder / "claude-settings.json"
    return AgentSetup(env=env, unset=("ANTHROPIC_API_KEY", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "CLAUDE_CODE_USE_FOUNDRY"),
                 args=["--settings", str(settings)], files={settings: json.dumps({"env": overrides}, indent=2) + "\n"})  # fmt: skip


# Claude Code compacts at its window less the answer's room (at most 20,000) less 13,000, and takes
# its window for a model not named claude-* from CLAUDE_CODE_MAX_CONTEXT_TOKENS (2.1.x)
_CLAUDE_BUFFER, _CLAUDE_ANSWER_ROOM, _CLAUDE_BASE = 13000, 20000, 24000  # BASE: its ~21k default request and a turn


def _claude_window(ctx: int, cap: int) -> dict[str, str]:
    """The context and answer cap Claude Code is told, so that it compacts a session before the
    server's context is full (else it takes 200,000 and a long session ends in a 400); nothing where
    the context is too small for it to compact above its own default request (it would every turn)."""
    if ctx - min(cap, _CLAUDE_ANSWER_ROOM) - _CLAUDE_BUFFER < _CLAUDE_BASE:
        return {}
    return {"CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(ctx), "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(cap)}


def _codex(url: str, model: str, ctx: int | None, token: str, folder: Path) -> AgentSetup:
    # -c overrides rather than a private CODEX_HOME: the user's sign-in, sessions and other settings stay
    # theirs and untouched, and -c beats config.toml and its profiles. The provider's id is ours, so a
    # user's own [model_providers.local] table is never merged with ours.
    pairs = {"model": model, "model_provider": "localinfer", "model_providers.localinfer.name": "localinfer",
             "model_providers.localinfer.base_url": f"{url}/v1", "model_providers.localinfer.wire_api": "responses",
             "model_providers.localinfer.env_key": KEY_VAR}  # fmt: skip
    args = [f"{k}={_toml(v)}" for k, v in pairs.items()]
    args.append(f"model_providers.localinfer.stream_idle_timeout_ms={STREAM_IDLE_MS}")
    if ctx:
        args.append(f"model_context_window={ctx}")
    args.append("analytics.enabled=false")
    return AgentSetup(env={KEY_VAR: token}, args=[a for kv in args for a in ("-c", kv)])


def _opencode(url: str, model: str, ctx: int | None, token: str, folder: Path, cap: int | None) -> AgentSetup:
    entry: dict = {"name": model, "tool_call": True}
    # OpenCode asks for `output` tokens (else 32,000: past any context here, a 400) and compacts before
    # prompt + output pass the context
    if ctx and cap:
        entry["limit"] = {"context": ctx, "output": cap}
    config = {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"localinfer": {"npm": "@ai-sdk/openai-compatible", "name": "localinfer",
                                    "options": {"baseURL": f"{url}/v1", "apiKey": "{env:" + KEY_VAR + "}"},  # the key never on disk
                                    "models": {model: entry}}},
        "model": f"localinfer/{model}", "small_model": f"localinfer/{model}", "autoupdate": False, "share": "disabled",
    }  # fmt: skip
    path = folder / "opencode.json"
    # OPENCODE_CONFIG is merged over the user's global config (theirs is read, never written)
    # no catalog look-up at models.opencode.ai: the model is ours, and offline it is an error in OpenCode's log
    env = {"OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1", KEY_VAR: token}
    return AgentSetup(env=env, files={path: json.dumps(config, indent=2) + "\n"})


def _qwen(url: str, model: str, ctx: int | None, token: str, folder: Path, cap: int | None) -> AgentSetup:
    # A system settings file (QWEN_CODE_SYSTEM_SETTINGS_PATH) ranks above the user's and the project's
    # settings.json; the environment ranks above every file (Qwen Code's documented layers)
    provider: dict = {"id": model, "name": model, "baseUrl": f"{url}/v1", "envKey": KEY_VAR}
    if ctx:
        provider["generationConfig"] = {"contextWindowSize": ctx}  # when it compresses the conversation
    settings = {"security": {"auth": {"selectedType": "openai"}}, "model": {"name": model}, "modelProviders": {"openai": [provider]},
                "general": {"enableAutoUpdate": False}, "privacy": {"usageStatisticsEnabled": False}}  # fmt: skip
    path = folder / "qwen-settings.json"
    env = {"QWEN_CODE_SYSTEM_SETTINGS_PATH": str(path), "OPENAI_BASE_URL": f"{url}/v1", "OPENAI_MODEL": model, "OPENAI_API_KEY": token}
    if cap:  # else it asks for 8k, and after an answer cut there asks the same again with 64k
        env["QWEN_CODE_MAX_OUTPUT_TOKENS"] = str(cap)
    return AgentSetup(env={**env, KEY_VAR: token}, files={path: json.dumps(settings, indent=2) + "\n"})


def _crush(url: str, model: str, ctx: int | None, token: str, folder: Path, cap: int | None) -> AgentSetup:
    entry: dict = {"id": model, "name": model}
    if ctx and cap:
        entry.update(context_window=ctx, default_max_tokens=cap)
    chosen = {"model": model, "provider": "localinfer"}
    config = {"$schema": "https://charm.land/crush.json",
              "providers": {"localinfer": {"name": "localinfer", "type": "openai-compat", "base_url": f"{url}/v1",
                                           "api_key": "$" + KEY_VAR, "models": [entry]}},  # the key never on disk
              "models": {"large": chosen, "small": chosen}, "options": {"disable_provider_auto_update": True}}  # fmt: skip
    # Crush's global data file (CRUSH_GLOBAL_DATA) ranks above the user's crush.json, which is still
    # read (their LSPs, MCPs, permissions), never written; Crush writes its own state to ours
    path = folder / "crush" / "crush.json"
    env = {"CRUSH_GLOBAL_DATA": str(path.parent), "CRUSH_DISABLE_PROVIDER_AUTO_UPDATE": "1", "CRUSH_DISABLE_METRICS": "1", KEY_VAR: token}
    return AgentSetup(env=env, files={path: json.dumps(config, indent=2) + "\n"})


def _continue(url: str, model: str, ctx: int | None, token: str, folder: Path, cap: int | None) -> AgentSetup:
    entry: dict = {"name": model, "provider": "openai", "model": model, "apiBase": f"{url}/v1",
                   "apiKey": "${{ secrets." + KEY_VAR + " }}", "roles": ["chat", "edit", "apply", "summarize"],
                   "capabilities": ["tool_use"]}  # fmt: skip
    if ctx and cap:
        entry["defaultCompletionOptions"] = {"contextLength": ctx, "maxTokens": cap}
    config = {"name": "localinfer", "version": "1.0.0", "schema": "v1", "models": [entry]}
    # A private CONTINUE_GLOBAL_DIR, as a private CODEX_HOME would be: without it the CLI reads and
    # writes ~/.continue (its onboarding writes config.yaml there); JSON is YAML
    home = folder / "continue"
    env = {"CONTINUE_GLOBAL_DIR": str(home), "CONTINUE_CLI_AUTO_UPDATED": "1", KEY_VAR: token}  # no npm install -g of itself
    return AgentSetup(env=env, args=["--config", str(home / "config.yaml")], files={home / "config.yaml": json.dumps(config, indent=2) + "\n"})


def _toml(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is a JSON string for what we write (no control characters)


def shown(agent: Agent, s: AgentSetup, user_args: list[str], url: str, model: str) -> str:
    """``--print``: shell lines a user can paste (``unset``, ``export``, the command), after the
    private configs (written already) as comments."""
    out = [f"# {agent.title} on localinfer at {url}, model {model}"]
    for path, text in s.files.items():
        out.append(f"# private config (written): {path}")
        out += [f"#   {line}" for line in text.splitlines()]
    out += [f"unset {name}" for name in s.unset]
    out += [f"export {k}={shlex.quote(v)}" for k, v in s.env.items()]
    out.append(shlex.join([agent.binary, *s.args, *user_args]))
    return "\n".join(out) + "\n"


def write(s: AgentSetup) -> None:
    """The private configs, 0600 (in our data folder only: never a user's own config)."""
    import os

    for path, text in s.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)  # whole or not at all: an agent starting meanwhile reads the old one
