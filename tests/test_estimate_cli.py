"""The pre-flight and llama.cpp's load options through `localinfer run` (the real entry point)."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_cli

pytestmark = pytest.mark.llama  # the commands ask llama.cpp about the build (tests/conftest.py)


def _json_run(*args: str, env: dict | None = None) -> dict:
    proc = run_cli("run", "--json", "--temperature", "0", "-n", "1", "-p", "Hi", *args, env=env)
    assert proc.returncode == 0, proc.stderr.decode()
    return json.loads(proc.stdout)


def test_an_absurd_context_is_refused_before_any_allocation():
    # Beyond the trained size it is a usage error (issue 21); within it, the memory estimate refuses.
    proc = run_cli("run", "-c", "10000000", "-p", "hi", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err  # refused up front by the pre-flight (loading would allocate 230 GB first)
    assert "--ctx-size 10000000 is beyond the 8192 tokens smollm2:135m was trained on" in err and "--force" in err
    assert "could not allocate" not in err and "Traceback" not in err and proc.stdout == b""

    proc = run_cli("run", "-c", "8192", "-p", "hi", env={"LOCALINFER_FAKE_RAM": "120MB"}, timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 6, err
    assert "not enough memory for smollm2:135m with a 8192-token context" in err
    assert "KV cache 188.7 MB" in err and "is available" in err
    assert "--cache-type-k q8_0" in err and "--force" in err and proc.stdout == b""


@pytest.mark.slow
def test_default_context_shrinks_to_fit_simulated_memory_and_force_overrides():
    data = _json_run(env={"LOCALINFER_FAKE_RAM": "250MB"})
    ctx = data["context"]
    assert ctx["source"] == "default, reduced to fit memory" and 512 <= ctx["n_ctx"] < 4096
    assert data["memory"]["estimate"]["total_bytes"] <= 250 * 1000**2

    refused = run_cli("run", "-p", "Hi", "-n", "1", env={"LOCALINFER_FAKE_RAM": "150MB"})
    assert refused.returncode == 6 and b"150.0 MB is available" in refused.stderr
    assert b"smaller quantization" in refused.stderr
    forced = run_cli("run", "--force", "-c", "256", "-p", "Hi", "-n", "1", env={"LOCALINFER_FAKE_RAM": "150MB"})
    assert forced.returncode == 0, forced.stderr.decode()
    assert b"loading anyway (--force)" in forced.stderr and forced.stdout.strip()


@pytest.mark.slow
def test_json_and_verbose_show_offload_context_and_memory():
    data = _json_run(env={"LOCALINFER_FAKE_VRAM": "8GB"})
    ctx, off, mem = data["context"], data["offload"], data["memory"]
    assert (ctx["n_ctx"], ctx["n_ctx_train"], ctx["source"]) == (4096, 8192, "default")
    assert off["layers"] == 31
    if not off["gpu_offload_supported"]:
        assert off["gpu_layers"] == 0  # auto on a CPU-only build: 0, even with a (simulated) GPU present
    else:
        # An offload-capable build (the RPC one in .ci/rpc) and only a simulated GPU: the plan offloads,
        # llama.cpp finds no device and keeps every layer on the host - and the report says so.
        assert mem["estimate"]["n_gpu_layers"] == 31
        assert off["gpu_layers"] == 0 and all(dev.startswith("CPU") for dev in off["devices"]), off
        mem = _json_run("--gpu-layers", "0")["memory"]  # the estimate, checked on the layout that loaded
    reported, est = mem["llama_cpp"], mem["estimate"]
    assert reported["kv_cache_bytes"] == 2 * 4096 * 30 * 3 * 64 * 2
    assert abs(est["total_bytes"] - reported["total_bytes"]) <= 0.1 * reported["total_bytes"]

    proc = run_cli("run", "--verbose", "--temperature", "0", "-n", "1", "-p", "Hi")
    err = proc.stderr.decode()
    assert proc.returncode == 0, err
    assert "4096 tokens (default; trained on 8192)" in err
    assert "GPU layers" in err and "0 / 31 offloaded" in err
    assert "KV 94.4 MB" in err and "estimated" in err


@pytest.mark.slow
def test_quantized_kv_cache_through_the_cli():
    f16 = _json_run("-c", "2048")["memory"]["llama_cpp"]["kv_cache_bytes"]
    q8 = _json_run("-c", "2048", "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    q8_kv = q8["memory"]["llama_cpp"]["kv_cache_bytes"]
    rounding = 0.005 * 2**20  # llama.cpp logs MiB with two decimals
    assert abs(q8_kv - f16 * 34 / 64) <= rounding  # q8_0: 34 bytes per 32 values, f16: 64
    assert abs(q8["memory"]["estimate"]["kv_cache_bytes"] - q8_kv) <= rounding


@pytest.mark.slow
def test_ctx_size_above_the_trained_context_needs_force_and_then_warns():
    refused = run_cli("run", "-c", "9000", "-n", "1", "-p", "Hi")
    assert refused.returncode == 2 and b"beyond the 8192 tokens smollm2:135m was trained on" in refused.stderr
    proc = run_cli("run", "-c", "9000", "-n", "1", "-p", "Hi", "--force")
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"beyond the 8192 tokens this model was trained on (--force)" in proc.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--cache-type-k", "q3"], "--cache-type-k"),
        (["--cache-type-v", "f8"], "--cache-type-v"),
        (["--flash-attn", "maybe"], "--flash-attn"),
        (["--batch-size", "0"], "--batch-size"),
        (["--gpu-layers", "-3"], "--gpu-layers"),
        (["--cache-type-v", "q8_0", "--flash-attn", "off"], "flash attention"),
    ],
)
def test_invalid_llama_cpp_options_are_usage_errors(args, needle):
    proc = run_cli("run", *args, "-p", "hi", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert needle in err and "Traceback" not in err and proc.stdout == b""


@pytest.mark.parametrize(
    "kw, needle",
    [
        ({"arch": "nosucharch"}, "does not support the model's architecture (unknown model architecture: 'nosucharch')"),
        ({}, "is not a usable model: error loading model hyperparameters: key not found in model: llama.embedding_length"),
    ],
)
def test_a_file_llama_cpp_cannot_load_is_a_bad_model_in_one_line(tmp_path, kw, needle):
    from ggufsynth import write_gguf

    path = write_gguf(tmp_path / "m.gguf", **kw)
    proc = run_cli("run", "-m", str(path), "-p", "hi", timeout=120)
    err = proc.stderr.decode()
    assert proc.returncode == 4, err
    assert needle in err and err.count("\n") == 2 and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs RLIMIT_AS in the child")
def test_an_allocation_failure_is_reported_as_memory():
    import resource

    def limit() -> None:  # the address space, not RAM: the allocation fails cleanly, nothing is swapped
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    proc = run_cli("run", "--force", "-c", "200000", "-p", "hi", "-n", "1", preexec_fn=limit)
    err = proc.stderr.decode()
    assert proc.returncode == 6, err
    assert "not enough memory to create a context for" in err and "could not allocate 4.6 GB" in err
    assert "kv cache" in err and err.count("\n") == 2
