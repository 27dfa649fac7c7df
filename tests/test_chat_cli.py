"""`localinfer chat` through the real entry point: the REPL in a pseudo-terminal (pexpect), piped
stdin mode, and the refusal of a model that has no chat format."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest
from typer.testing import CliRunner

from conftest import run_cli

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")
STATS = re.compile(
    r"(\d+) tokens · TTFT [^·]+ · decode [^·]+ · prompt (\d+) evaluated, (\d+) cached · context (\d+)/(\d+)"
)
STATS_B = re.compile(STATS.pattern.encode())
PROMPT = ">>> "


def test_chat_help_lists_the_run_options():
    from localinfer.cli.main import build_app

    res = CliRunner().invoke(build_app(), ["chat", "--help"])
    assert res.exit_code == 0
    for opt in ("--model", "--system", "--temperature", "--top-p", "--top-k", "--min-p", "--repeat-penalty",
                "--seed", "--max-tokens", "--ctx-size", "--threads", "--gpu-layers", "--flash-attn",
                "--cache-type-k", "--cache-type-v", "--no-mmap", "--mlock", "--batch-size", "--offline",
                "--quiet", "--verbose"):
        assert opt in res.stdout, opt


class Repl:
    """A `localinfer chat` in a pseudo-terminal, driven like a user would."""

    def __init__(self, model_path, *args: str) -> None:
        import pexpect

        env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm", "COLUMNS": "250"}
        env.pop("NO_COLOR", None)
        self.child = pexpect.spawn(
            sys.executable,
            ["-m", "localinfer", "chat", "-m", str(model_path), "-t", "1", *args],
            env=env,
            encoding="utf-8",
            dimensions=(50, 250),
            timeout=120,
        )
        self.child.expect("/help for commands")
        self.child.expect_exact(PROMPT)

    def turn(self, text: str) -> tuple[str, dict[str, int]]:
        """Send a message; return the answer as shown and the stats line's numbers."""
        self.child.sendline(text)
        self.child.expect(STATS)
        raw = self.child.before
        # prompt_toolkit turns bracketed paste off when it hands the line over: the answer follows.
        answer = ANSI.sub("", raw[raw.rfind("\x1b[?2004l") :]).replace("\r", "")
        numbers = dict(zip(("tokens", "evaluated", "cached", "used", "n_ctx"), map(int, self.child.match.groups())))
        self.child.expect_exact(PROMPT)
        return answer.strip(), numbers

    def command(self, line: str, expect: str) -> str:
        self.child.sendline(line)
        self.child.expect(expect)
        seen = ANSI.sub("", self.child.before + self.child.after)
        self.child.expect_exact(PROMPT)
        return seen

    def finish(self) -> int:
        import pexpect

        self.child.expect(pexpect.EOF)
        self.child.close()
        return self.child.exitstatus


@pytest.mark.slow
def test_repl_turns_reuse_the_cache_and_set_retry_help_quit(smollm2_path, isolated_home):
    repl = Repl(smollm2_path, "-c", "1024", "-n", "24", "--seed", "3")
    try:
        a1, s1 = repl.turn("What is the capital of France?")
        assert a1 and s1["cached"] == 0 and s1["n_ctx"] == 1024 and s1["evaluated"] > 10
        a2, s2 = repl.turn("And of Italy?")
        # The second turn reuses all of the first (prompt and answer) and evaluates only its message.
        assert s2["cached"] == s1["used"] and s2["evaluated"] < 20

        repl.command("/set max_tokens 3", r"Set max_tokens = 3\.")
        _, s3 = repl.turn("Tell me a long story.")
        assert s3["tokens"] == 3

        repl.command("/set temperature 0", r"Set temperature = 0 \(greedy\)\.")
        repl.command("/set max_tokens 12", r"Set max_tokens = 12\.")
        a4, _ = repl.turn("Name a fruit.")
        repl.child.sendline("/retry")
        repl.child.expect(r"the answer will be the same; [^\n]* to vary it\x1b\[0m\r\n")
        repl.child.expect(STATS)
        again = ANSI.sub("", repl.child.before).replace("\r", "").strip()
        repl.child.expect_exact(PROMPT)
        assert a4 and again == a4

        repl.command("/frobnicate", r"unknown command /frobnicate.*\r\n.*/help")
        repl.command("/help", r"/retry +regenerate the last answer")
        repl.child.sendcontrol("c")  # at an empty prompt: a hint, not an exit
        repl.child.expect(r"to quit, type /exit or press Ctrl-D")
        repl.child.expect_exact(PROMPT)
        repl.child.sendcontrol("d")
        assert repl.finish() == 0
    finally:
        repl.child.close(force=True)
    history = (isolated_home / "chat_history").read_text()
    assert "What is the capital of France?" in history and "/set max_tokens 3" in history


@pytest.mark.slow
def test_repl_save_clear_load_system_show_stats(smollm2_path, tmp_path):
    repl = Repl(smollm2_path, "-c", "512", "-n", "8", "--temperature", "0", "--system", "You are terse.")
    try:
        a1, s1 = repl.turn("Hello!")
        saved = tmp_path / "conv.json"
        repl.command(f"/save {saved}", r"Saved 3 messages")
        data = json.loads(saved.read_text())
        assert [m["role"] for m in data["messages"]] == ["system", "user", "assistant"]
        assert data["messages"][0]["content"] == "You are terse." and data["messages"][1]["content"] == "Hello!"
        assert data["messages"][2]["content"].strip() == a1

        repl.command("/clear", "New conversation")
        _, s2 = repl.turn("Something else.")
        assert s2["cached"] == 0  # /clear emptied the KV cache

        repl.command(f"/load {saved}", r"Loaded 3 messages")
        _, s3 = repl.turn("And you?")
        assert s3["cached"] > 0  # at least the system prompt is still in the cache
        repl.command("/save " + str(tmp_path / "after.json"), r"Saved 5 messages")
        after = json.loads((tmp_path / "after.json").read_text())
        assert after["messages"][:3] == data["messages"]
        assert after["messages"][3] == {"role": "user", "content": "And you?"}

        repl.command("/system", r"System prompt: 'You are terse\.'")
        shown = repl.command("/show", r"stop +none")
        assert re.search(r"system prompt +'You are terse\.'", shown) and re.search(r"max_tokens +8", shown)
        assert re.search(r"context +512 tokens", shown)
        # one truth about the size: the parameter count, not llama.cpp's "256M" class beside it
        assert re.search(r"description +llama Q4_1\r?\n", shown) and re.search(r"parameters +135 M", shown), shown
        stats = repl.command("/stats", r"dropped to fit +0 messages")
        assert re.search(r"turns +3", stats) and "reused from the KV cache" in stats
        repl.command("/load " + str(tmp_path / "nope.json"), r"Error: cannot read")

        repl.command(f"/model {tmp_path / 'missing.gguf'}", r"Error: ")  # a failed switch keeps the chat going
        repl.command(f"/model {smollm2_path}", r"Switched to .* \(context 512 tokens\); 4 messages kept")
        _, s4 = repl.turn("Still there?")
        assert s4["cached"] == 0 and s4["evaluated"] > 30  # a new model: the whole conversation is evaluated
        repl.child.sendline("/exit")
        assert repl.finish() == 0
    finally:
        repl.child.close(force=True)


@pytest.mark.slow
def test_repl_ctrl_c_stops_the_answer_and_the_chat_goes_on(smollm2_path, tmp_path):
    repl = Repl(smollm2_path, "-c", "1024", "--seed", "7")
    try:
        repl.child.sendline("Write a very long story about a dragon and a knight.")
        repl.child.expect_exact("\x1b[?2004l")  # prompt_toolkit has handed the line over
        repl.child.expect(r"\w+ \w+ \w+ \w+ \w+ \w+")  # the answer is streaming
        repl.child.sendintr()
        repl.child.expect(r"\[interrupted: the partial answer is kept\]")
        repl.child.expect(r"cached · context (\d+)/1024 · interrupted")
        interrupted_used = int(repl.child.match.group(1))
        repl.child.expect_exact(PROMPT)
        repl.command("/set max_tokens 8", "Set max_tokens")
        _, stats = repl.turn("Thanks, that is enough.")
        assert stats["cached"] >= interrupted_used - 1 > 0  # the partial answer stayed in the context
        repl.command(f"/save {tmp_path / 'c.json'}", "Saved 4 messages")
        data = json.loads((tmp_path / "c.json").read_text())
        assert data["interrupted"] == [1] and data["messages"][1]["role"] == "assistant"
        repl.child.sendcontrol("d")
        assert repl.finish() == 0
    finally:
        repl.child.close(force=True)


@pytest.mark.slow
def test_piped_stdin_each_line_is_a_turn(smollm2_path):
    proc = run_cli("chat", "-m", str(smollm2_path), "-t", "1", "-n", "12", "--seed", "1", input="hi\nand then?\n")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.strip() and not ANSI.search(proc.stdout.decode()) and b"\x1b" not in proc.stderr
    assert b">>>" not in proc.stdout and b"/help" not in proc.stdout + proc.stderr
    stats = STATS_B.findall(proc.stderr)
    assert len(stats) == 2 and int(stats[0][2]) == 0 and int(stats[1][2]) > 0
    assert not STATS_B.search(proc.stdout)

    quiet = run_cli("chat", "-m", str(smollm2_path), "-t", "1", "-n", "4", "-q", input="hi\n")
    assert quiet.returncode == 0 and quiet.stdout.strip() and quiet.stderr == b""

    # Commands and a multi-line block work in scripts too; command output goes to stderr.
    block = '/set max_tokens 2\n"""\nfirst line\nsecond line\n"""\n/show\n'
    proc = run_cli("chat", "-m", str(smollm2_path), "-t", "1", input=block)
    assert proc.returncode == 0, proc.stderr.decode()
    assert [int(s[0]) for s in STATS_B.findall(proc.stderr)] == [2]
    assert b"Set max_tokens = 2." in proc.stderr and b"max_tokens" not in proc.stdout

    bad = run_cli("chat", "-m", str(smollm2_path), "-t", "1", input="/frobnicate\n")
    assert bad.returncode == 2 and b"unknown command /frobnicate" in bad.stderr


@pytest.mark.llama
def test_piped_chat_goes_on_after_a_bad_line_and_exits_with_its_code(smollm2_path, fake_backend):  # noqa: F811
    # As in the REPL, a failed command is an error message; the later lines still run.
    fake_backend.enqueue(["Hello", " there", " friend"])
    script = "/model nosuch-model:1b\n/set max_tokens 2\nhi\n"
    proc = _invoke("chat", "-m", str(smollm2_path), "-t", "1", "--offline", "--no-log", input=script)
    assert b"nosuch-model" in proc.stderr and b"Set max_tokens = 2." in proc.stderr
    assert [int(s[0]) for s in STATS_B.findall(proc.stderr)] == [2] and proc.stdout.strip()
    assert proc.returncode == 3  # the failure is still reported to the script
    assert fake_backend.requests[0].messages[-1] == {"role": "user", "content": "hi"}


def _invoke(*args: str, input: str):
    """The command in this process (CliRunner), its outcome shaped as run_cli's."""
    import types

    from localinfer.cli.main import build_app

    res = CliRunner().invoke(build_app(), list(args), input=input)
    return types.SimpleNamespace(returncode=res.exit_code, stdout=res.stdout_bytes, stderr=res.stderr_bytes)


@pytest.mark.slow
def test_piped_overflow_with_a_tiny_context_drops_old_turns(smollm2_path):
    line = "Tell me about the sea, the ships, the wind, the waves, the treasure and the islands. " * 2
    proc = run_cli(
        "chat", "-m", str(smollm2_path), "-t", "1", "-c", "256", "-n", "16", "--system", "You are a pirate.",
        input="".join(f"{i}: {line}\n" for i in range(4)),
    )
    assert proc.returncode == 0, proc.stderr.decode()
    err = proc.stderr.decode()
    assert "dropped the" in err and "256-token context; the system prompt is kept" in err
    stats = STATS.findall(err)
    assert len(stats) == 4 and all(int(s[3]) <= 256 and int(s[4]) == 256 for s in stats)


@pytest.mark.slow
def test_a_model_without_chat_format_is_refused(gemma_path):
    proc = run_cli("chat", "-m", str(gemma_path), input="hi\n")
    assert proc.returncode == 2
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "no chat template" in lines[0]
    assert f"localinfer run --raw -m {gemma_path}" in lines[0]
    assert proc.stdout == b""


@pytest.mark.slow
def test_repl_multiline_input_paste_block_and_alt_enter(smollm2_path, tmp_path):
    repl = Repl(smollm2_path, "-c", "512", "-n", "2", "--temperature", "0")
    try:
        repl.child.send("\x1b[200~pasted one\npasted two\x1b[201~")  # a bracketed paste keeps its lines
        repl.turn("")
        repl.child.send('"""\r')  # a """ block: Enter adds lines until the closing """
        repl.child.send("block one\r")
        repl.child.send("block two\r")
        repl.turn('"""')
        repl.child.send("alt one\x1b\r")  # Alt+Enter (Esc, Enter) inserts a newline
        repl.turn("alt two")
        repl.command(f"/save {tmp_path / 'm.json'}", "Saved 6 messages")
        users = [m["content"] for m in json.loads((tmp_path / "m.json").read_text())["messages"] if m["role"] == "user"]
        assert users == ["pasted one\npasted two", "block one\nblock two", "alt one\nalt two"]
        repl.child.sendline("/bye")
        assert repl.finish() == 0
    finally:
        repl.child.close(force=True)


@pytest.mark.slow
def test_repl_on_a_60_column_terminal_wraps_at_word_boundaries(smollm2_path):
    # The banner, /help and /show were single long lines the terminal broke mid-word (issue 31).
    import pexpect

    from localinfer.render.chat import HELP

    env = {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1", "TERM": "xterm", "COLUMNS": "60", "NO_COLOR": "1"}
    child = pexpect.spawn(sys.executable, ["-m", "localinfer", "chat", "-m", str(smollm2_path), "-t", "1"],
                          env=env, encoding="utf-8", dimensions=(50, 60), timeout=120)  # fmt: skip
    try:
        child.expect("Ctrl-D to quit")
        banner = ANSI.sub("", child.before + child.after).replace("\r", "")
        child.expect_exact(">>>")  # at 60 columns prompt_toolkit moves the cursor instead of the space
        child.sendline("/help")
        child.expect(r"clears the line\.")
        shown = ANSI.sub("", child.before + child.after).replace("\r", "")
        child.expect_exact(">>>")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    lines = (banner + shown[shown.index("Commands:") :]).splitlines()
    assert all(len(line) <= 60 or " " not in line.strip() for line in lines), lines  # a long path stays whole
    assert shown[shown.index("Commands:") :].split() == HELP.split()  # every word, whole and in order
    assert "/retry               regenerate the last answer" in shown
    assert "  /clear               start a new conversation (same system\n                       prompt;" in shown
