"""The resident server's plain logic: --keep-alive values, when a loaded model is reused, reloaded
or unloaded, and where the socket goes (no model, no server)."""

from __future__ import annotations

import math
import os

import pytest

from localinfer.errors import UsageError
from localinfer.serve.models import pool
from localinfer.units import parse_keep_alive
from localinfer.resident.start import SUN_PATH_MAX, place, private_folder


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300.0), ("30s", 30.0), ("1h", 3600.0), ("90", 90.0), ("1.5s", 1.5), ("250ms", 0.25),
     ("0", None), ("off", None), (None, None), ("-1", math.inf), ("forever", math.inf), (" 2S ", 2.0)],
)
def test_keep_alive_values(text, seconds):
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("text", ["soon", "5 minutes", "-5m", "1y", "m5"])
def test_a_bad_keep_alive_is_a_usage_error(text):
    with pytest.raises(UsageError, match="--keep-alive must be a duration"):
        parse_keep_alive(text)


def _loaded(**kw) -> pool.Loaded:
    base = dict(key="/m.gguf", name="m", options={"n_threads": 4, "cache_type_k": "f16"}, sequences=1,
                ctx_asked=4096, n_ctx_seq=4096, keep_alive=300.0, last_used=100.0)
    base.update(kw)
    return pool.Loaded(**base)


def test_a_smaller_context_and_the_same_options_reuse_the_loaded_model():
    loaded = _loaded()
    assert pool.reload_reason(loaded, pool.Want("/m.gguf", {"n_threads": 4, "cache_type_k": "f16"}, 1, 512)) is None
    assert pool.reload_reason(loaded, pool.Want("/m.gguf", {"n_threads": 4, "cache_type_k": "f16"}, 1, 4096)) is None


def test_a_larger_context_other_options_or_more_sequences_reload_and_say_why():
    loaded = _loaded()
    same = {"n_threads": 4, "cache_type_k": "f16"}
    assert "context of 8192 tokens is more than the loaded 4096" in pool.reload_reason(loaded, pool.Want("/m.gguf", same, 1, 8192))
    assert pool.reload_reason(loaded, pool.Want("/m.gguf", {**same, "n_threads": 2}, 1, 512)) == "--threads 2 differs from the loaded 4"
    assert "--cache-type-k q8_0" in pool.reload_reason(loaded, pool.Want("/m.gguf", {**same, "cache_type_k": "q8_0"}, 1, 512))
    assert "4 sequences are more than the loaded 1" in pool.reload_reason(loaded, pool.Want("/m.gguf", same, 4, 512))


def test_a_reload_keeps_the_room_the_model_had():
    grown = pool.grown(_loaded(sequences=4, ctx_asked=2048), pool.Want("/m.gguf", {}, 1, 8192))
    assert (grown.sequences, grown.ctx_per_seq) == (4, 8192)


def test_a_context_the_preflight_shrank_is_not_reloaded_for_again():
    # asked 4096, got 2048 to fit: asking 4096 again must not reload every time
    loaded = _loaded(n_ctx_seq=2048)
    assert pool.reload_reason(loaded, pool.Want("/m.gguf", dict(loaded.options), 1, 4096)) is None


def test_sampling_options_are_not_load_options():
    from localinfer.engine.types import LoadOptions

    fields = pool.load_fields(LoadOptions(n_ctx=512, n_seq_max=2, verbose=True))
    assert "n_ctx" not in fields and "n_seq_max" not in fields and "verbose" not in fields
    assert not {"temperature", "top_p", "seed"} & set(fields)


def test_least_recently_used_idle_models_go_first_and_busy_ones_never():
    a, b, c = _loaded(key="a", last_used=10.0), _loaded(key="b", last_used=5.0, busy=1), _loaded(key="c", last_used=7.0)
    assert [m.key for m in pool.victims([a, b, c], max_models=2, adding=True)] == ["c", "a"]
    assert [m.key for m in pool.victims([a, b, c], max_models=3, adding=True)] == ["c"]
    assert pool.victims([a, b, c], max_models=None, adding=True) == []


def test_idle_models_expire_after_their_keep_alive_only():
    fresh, old, busy = _loaded(key="f", last_used=99.0), _loaded(key="o", last_used=90.0, keep_alive=5.0), _loaded(key="b", last_used=0.0, busy=1)
    forever = _loaded(key="x", last_used=0.0, keep_alive=math.inf)
    assert [m.key for m in pool.expired([fresh, old, busy, forever], now=100.0)] == ["o"]
    assert old.unloads_in(94.0) == 1.0 and busy.unloads_in(100.0) == 300.0


def test_the_socket_lives_in_the_data_dir_or_in_a_private_tmp_folder_when_that_is_too_deep(tmp_path):
    short = place(tmp_path)
    if len(os.fsencode(tmp_path / "resident" / "socket")) <= SUN_PATH_MAX:
        assert short.socket == tmp_path / "resident" / "socket"
    deep = tmp_path / ("d" * 120)
    far = place(deep)
    assert far.socket.parent.name == f"localinfer-{os.getuid()}" and len(os.fsencode(far.socket)) <= SUN_PATH_MAX
    assert far.log == deep / "resident" / "server.log"
    assert place(tmp_path / ("e" * 120)).socket != far.socket  # one per data dir


def test_the_private_folder_is_made_0700_and_tightened(tmp_path):
    folder = tmp_path / "resident"
    private_folder(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)
    private_folder(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    blocked = tmp_path / "file"
    blocked.write_text("x")
    with pytest.raises(OSError):
        private_folder(blocked)
