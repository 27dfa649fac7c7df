"""The option groups (cli/options.py): each flag declared once, attached to every command that takes
it, and given to the command body as one plain value."""

from __future__ import annotations

import dataclasses

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from localinfer.cli import options as o
from localinfer.cli.main import build_app

# Which commands take which group, and the flags each command declares its own way instead.
LOAD_COMMANDS = {
    "run": (),
    "chat": (),
    "batch": ("ctx_size",),  # per sequence
    "serve": ("ctx_size",),  # per sequence
    "embed": ("ctx_size",),  # the embedding context (the longest input)
    "bench": ("ctx_size", "threads", "gpu_layers", "batch_size", "mlock"),  # lists to sweep; no --mlock
}
SAMPLING_COMMANDS = ("run", "chat", "batch")
COST_COMMANDS = ("bench", "stats")
SERVER_COMMANDS = ("run", "chat", "batch", "bench", "embed", "ps")


def _commands() -> dict:
    return typer.main.get_command(build_app()).commands


def _described(param) -> tuple:
    """What --help shows of an option, and how it parses."""
    return (param.opts, param.secondary_opts, param.help, param.default, param.envvar, param.rich_help_panel,
            param.metavar, type(param.type).__name__, getattr(param.type, "min", None), getattr(param.type, "max", None))  # fmt: skip


def _declared(group: o.OptionGroup) -> dict[str, tuple]:
    """The group's flags as Typer makes them on a command of their own."""
    app = typer.Typer(add_completion=False)
    app.command()(o.grouped(lambda value=group: None))
    return {p.name: _described(p) for p in typer.main.get_command(app).params}


@pytest.mark.parametrize(
    ("group", "takers"),
    [
        (o.LOAD, LOAD_COMMANDS),
        (o.SAMPLING, dict.fromkeys(SAMPLING_COMMANDS, ())),
        (o.COST, dict.fromkeys(COST_COMMANDS, ())),
        (o.SERVER, dict.fromkeys(SERVER_COMMANDS, ())),
        (o.DRAFT, dict.fromkeys(("run", "chat", "batch", "serve", "bench"), ())),
    ],
    ids=["load", "sampling", "cost", "server", "draft"],
)
def test_every_command_taking_a_group_shows_each_of_its_flags_as_declared_once(group, takers):
    declared = _declared(group)
    assert set(declared) == {p.name for p in group.flags} and len(declared) >= 3
    commands = _commands()
    for name, own in takers.items():
        shown = {p.name: _described(p) for p in commands[name].params}
        for flag, description in declared.items():
            if flag in own:
                continue
            assert shown.get(flag) == description, (name, flag)
    own_elsewhere = {"bench": {"seed"}, "doctor": {"rpc"}, "serve": {"api_key"}}  # other flags of the same name and meaning
    for name, command in commands.items():  # and no other command re-declares one
        if name not in takers:
            assert not {p.name for p in command.params} & set(declared) - own_elsewhere.get(name, set()), name


# The common flags: run declares each with the same alias (its help shows them in its own order),
# batch has no --force, serve no --quiet, bench its own --quiet and --verbose; pull its own --offline.
COMMON_COMMANDS = {"run": (), "chat": (), "batch": ("force",), "embed": (), "serve": ("quiet",), "bench": ("quiet", "verbose")}


def test_the_common_flags_are_declared_once_and_shown_alike_by_each_command():
    declared = _declared(o.COMMON)
    assert set(declared) == {"force", "offline", "no_log", "quiet", "verbose"}
    commands = _commands()
    for name, command in commands.items():
        shown = {p.name: _described(p) for p in command.params}
        own = COMMON_COMMANDS.get(name)
        if own is None:
            assert not set(shown) & set(declared) - ({"offline"} if name == "pull" else set()), name
            continue
        for flag, description in declared.items():
            if flag not in own:
                assert shown.get(flag) == description, (name, flag)


@pytest.mark.llama
def test_a_group_reads_the_flags_of_another_whichever_comes_first():
    """The load group's --verbose comes from the common group, declared before or after it."""
    seen = {}

    def first(flags: object = o.COMMON, load: object = o.LOAD) -> None:
        seen.update(first=(flags.verbose, load.verbose))

    def second(load: object = o.LOAD, flags: object = o.COMMON) -> None:
        seen.update(second=(flags.verbose, load.verbose))

    for command in (first, second):
        app = typer.Typer()
        app.command()(o.grouped(command))
        res = CliRunner().invoke(app, ["--verbose"])
        assert res.exit_code == 0, res.output
    assert seen == {"first": (True, True), "second": (True, True)}


def test_the_command_body_gets_one_ready_value_for_each_group(monkeypatch):
    seen = {}
    app = typer.Typer()

    @app.command()
    @o.grouped
    def probe(
        load: object = o.LOAD,
        sampling: object = o.SAMPLING,
        verbose: bool = typer.Option(False, "--verbose"),
        server: object = o.SERVER,
    ) -> None:
        seen.update(load=load, sampling=sampling, verbose=verbose, server=server)

    args = ["-c", "512", "-t", "3", "-ngl", "7", "-fa", "ON", "-ctk", "q8_0", "--no-mmap", "--mlock", "-b", "64",
            "--no-cpu-repack", "--rpc", "10.0.0.2:50052", "--temp", "0", "--top-k", "5", "--seed", "9", "--verbose"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    from localinfer.engine.types import LoadOptions
    from localinfer.request.sampling import SamplingOptions

    assert seen["load"] == LoadOptions(
        n_ctx=512, n_threads=3, n_gpu_layers=7, flash_attn="on", cache_type_k="q8_0", use_mmap=False, use_mlock=True,
        n_batch=64, cpu_repack=False, rpc_servers=("10.0.0.2:50052",), verbose=True,
    )  # fmt: skip
    assert seen["sampling"] == SamplingOptions(temperature=0.0, top_k=5, seed=9)
    assert seen["verbose"] is True and seen["server"] is None

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    res = CliRunner().invoke(app, ["--endpoint", "http://10.0.0.3:8080", "--api-key", "k", "--timeout", "5", "-ctk", "q3"])
    assert res.exit_code == 0, res.output
    from localinfer.remote.connection import Endpoint

    assert seen["server"] == Endpoint("http://10.0.0.3:8080/v1", "k", 5.0)
    assert seen["load"] is None  # nothing loaded with --endpoint: the load flags are not read


@pytest.mark.llama
def test_a_part_of_a_group_keeps_the_defaults_of_the_flags_it_leaves_out():
    part = o.LOAD.only("no_mmap", "cache_type_v")
    assert [p.name for p in part.flags] == ["no_mmap", "cache_type_v"]
    value = part.value({"no_mmap": True, "cache_type_v": "q4_0"}, {"verbose": False})
    full = o.LOAD.value({**o.LOAD.defaults, "no_mmap": True, "cache_type_v": "q4_0"}, {})
    assert value == full and value.use_mmap is False and value.cache_type_v == "q4_0" and value.n_batch == 2048
    assert dataclasses.replace(value, use_mmap=True, cache_type_v="f16") == o.LOAD.value(o.LOAD.defaults, {})


def test_with_endpoint_the_load_group_is_not_read():
    """Nothing is loaded with --endpoint: its flags are not checked (that would load llama.cpp)."""
    assert o.LOAD.value({**o.LOAD.defaults, "cache_type_k": "q3"}, {"endpoint": "http://127.0.0.1:1/v1"}) is None
    assert o.SAMPLING.value(o.SAMPLING.defaults, {"endpoint": "http://127.0.0.1:1/v1"}) is not None


# The one line a bad value gets, from whichever command takes the flag. Each fails before a model
# is resolved or any input read, so no model is needed.
BAD_VALUES = [
    (("--cache-type-k", "q3"), "Error: --cache-type-k must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, not 'q3'"),
    (("-fa", "maybe"), "Error: --flash-attn must be one of auto, on, off, not 'maybe'"),
    (("--gpu-layers", "lots"), "Error: --gpu-layers must be auto, all or a number, not 'lots'"),
    (("--rpc", "nohost"), "Error: --rpc takes HOST:PORT[,HOST:PORT...], not 'nohost'"),
]
COMMAND_ARGS = {"run": ["-p", "hi"], "chat": [], "batch": ["missing-input.jsonl"], "serve": [], "bench": [], "embed": ["missing-input.txt"]}


@pytest.mark.parametrize(("flag", "line"), BAD_VALUES, ids=[f for (f, _), _ in BAD_VALUES])
@pytest.mark.llama
def test_a_bad_value_of_a_load_flag_is_the_same_line_from_every_command(flag, line, tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path))
    app = build_app()
    for name, args in COMMAND_ARGS.items():
        res = CliRunner().invoke(app, [name, *args, *flag])
        assert res.exit_code == 2, (name, res.output)
        assert res.stderr.splitlines()[0] == line, (name, res.stderr)
        assert res.stdout == ""


@pytest.mark.llama
def test_a_bad_cost_flag_is_the_same_line_from_bench_and_stats(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path))
    app = build_app()
    for name in COST_COMMANDS:
        res = CliRunner().invoke(app, [name, "--watts", "300"])
        assert res.exit_code == 2, (name, res.output)
        assert res.stderr.splitlines()[0] == "Error: --watts and --kwh-price go together", (name, res.stderr)


def test_a_bad_endpoint_is_the_same_line_from_every_command_taking_it(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALINFER_HOME", str(tmp_path))
    app = build_app()
    for name in SERVER_COMMANDS:
        res = CliRunner().invoke(app, [name, *COMMAND_ARGS.get(name, []), "--endpoint", "ftp://10.0.0.3"])
        assert res.exit_code == 2, (name, res.output)
        assert res.stderr.splitlines()[0] == (
            "Error: --endpoint must be an http(s) URL such as http://127.0.0.1:8080/v1, not 'ftp://10.0.0.3'"
        ), (name, res.stderr)


@pytest.mark.parametrize("flag", [("--temperature", "-1"), ("--top-p", "1.5"), ("--seed", "-1")])
def test_a_sampling_value_out_of_range_is_refused_alike_by_each_command(flag):
    app = build_app()
    messages = set()
    for name in SAMPLING_COMMANDS:
        res = CliRunner().invoke(app, [name, *COMMAND_ARGS[name], *flag])
        assert res.exit_code == 2, (name, res.output)
        messages.add(next(line for line in res.stderr.splitlines() if flag[0] in line and "Invalid value" in line))
    assert len(messages) == 1, messages


def test_a_group_flag_named_twice_in_one_command_fails_when_the_command_is_built():
    def clash(ctx_size: int = 0, load: object = o.LOAD) -> None: ...

    with pytest.raises(ValueError, match="duplicate parameter name: 'ctx_size'"):
        o.grouped(clash)


def test_the_keep_alive_group_is_on_run_chat_and_batch_as_declared_once():
    declared = _declared(o.KEEP_ALIVE)
    assert set(declared) == {"keep_alive", "max_models"}
    for name, command in _commands().items():
        shown = {p.name: _described(p) for p in command.params}
        if name in ("run", "chat", "batch"):
            assert all(shown.get(flag) == d for flag, d in declared.items()), name
        elif name == "serve":  # the server's own: how long its models stay loaded, how many at once
            assert set(shown) & set(declared) == set(declared) and all(shown[f] != d for f, d in declared.items())
        else:
            assert not set(shown) & set(declared), name


def test_keep_alive_is_off_by_default_and_with_endpoint():
    from localinfer.resident.place import KeepAlive

    assert o.KEEP_ALIVE.value({}, {}) is None
    assert o.KEEP_ALIVE.value({"keep_alive": "0"}, {}) is None
    assert o.KEEP_ALIVE.value({"keep_alive": "5m", "max_models": 2}, {}) == KeepAlive(300.0, 2)
    assert o.KEEP_ALIVE.value({"keep_alive": "5m"}, {"endpoint": "http://127.0.0.1:8080/v1"}) is None
