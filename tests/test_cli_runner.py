"""CLI logic through Typer's CliRunner (in-process, no model needed)."""

from typer.testing import CliRunner

from localinfer import __version__
from localinfer.cli.main import build_app

runner = CliRunner()


def test_version_and_help():
    app = build_app()
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.stdout.strip() == f"localinfer {__version__}"
    res = runner.invoke(app, ["run", "--help"])
    assert res.exit_code == 0
    for opt in (
        "--prompt",
        "--system",
        "--temperature",
        "--top-p",
        "--top-k",
        "--min-p",
        "--repeat-penalty",
        "--seed",
        "--max-tokens",
        "--stop",
        "--ctx-size",
        "--threads",
        "--gpu-layers",
        "--raw",
        "--json",
        "--quiet",
        "--verbose",
        "--on-overflow",
    ):
        assert opt in res.stdout, opt


def test_usage_errors_exit_2():
    app = build_app()
    res = runner.invoke(app, ["run", "--max-tokens", "0", "-p", "x"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["run", "--on-overflow", "explode", "-p", "x"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["run", "both", "-p", "x"])
    assert res.exit_code == 2 and "not both" in res.output


def test_help_does_not_import_heavy_modules():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from localinfer.cli.main import build_app\n"
        "try:\n    build_app()(['--help'], prog_name='localinfer')\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('llama_cpp', 'huggingface_hub', 'numpy', 'psutil', 'jinja2') if m in sys.modules]\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "HEAVY []" in proc.stderr, proc.stderr
