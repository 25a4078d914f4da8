#!/usr/bin/env python3
"""The decoder-package benchmark's inputs (docs/benchmarks.md, "Decoder packages"): a small
LLaMA-style checkpoint with random weights saved locally with `transformers`, a tokenizer for it
(onnxruntime-genai's model builder needs one), and `torch.onnx`'s export of the same checkpoint
with the KV cache at the interface (the exporter code of tools/gen_fixtures.py).

    .venv-fixtures/bin/python tools/bench_decoder.py OUT [--arch llama|qwen2] [--torchscript]

writes OUT/hf (the checkpoint, tokenizer, config) and OUT/torch/model.onnx (+ .data); with
`--torchscript`, also the TorchScript exporter's export (opset 17) as OUT/torchscript/model.onnx.
Then:

    python -m onnxruntime_genai.models.builder -i OUT/hf -o OUT/builder_int4 -p int4 -e cpu
    python -m onnxruntime_genai.models.builder -i OUT/hf -o OUT/builder_fp32 -p fp32 -e cpu
    mmq compile OUT/torch/model.onnx --package --quant int4 -o OUT/mmq_int4 \\
        --generation-config OUT/hf/config.json --tokenizer OUT/hf/tokenizer.json
    mmq compile OUT/torch/model.onnx --package --quant int4 --kv-cache int8 -o OUT/mmq_int4_kv8 \\
        --generation-config OUT/hf/config.json
    python tools/genai_bench.py --fp32 OUT/builder_fp32 --package builder-int4=OUT/builder_int4 \\
        --package mmq-int4=OUT/mmq_int4 --package mmq-int4-kv8=OUT/mmq_int4_kv8 \\
        --pipeline mmq-int4-pipe=OUT/mmq_int4 --pipeline mmq-int4-kv8-pipe=OUT/mmq_int4_kv8
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_fixtures as gf  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CONFIG = dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
# `--arch qwen2`: the same sizes with Q/K/V biases, 4 layers, a 512-token context.
ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM,
              dict(num_hidden_layers=4, max_position_embeddings=512)),
}
WORDS = ["the", "a", "model", "token", "cache", "key", "value", "attention", "layer", "head",
         "onnx", "runtime", "benchmark", "decode", "prefill", "random", "weight", "matrix",
         "vector", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "hello", "world"]


def tokenizer(out: Path) -> None:
    """A byte-level BPE of the model's vocabulary size, trained on generated sentences; ids 0-3
    are <pad>, <s>, </s>, <unk>."""
    rng = random.Random(0)

    def sentence() -> str:
        w = [rng.choice(WORDS) for _ in range(rng.randint(4, 16))]
        w += ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
              for _ in range(rng.randint(1, 4))]
        w.append(str(rng.randint(0, 100000)))
        rng.shuffle(w)
        return " ".join(w).capitalize() + rng.choice([".", "!", "?", ","])

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=CONFIG["vocab_size"], special_tokens=specials,
                                  min_frequency=1,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([sentence() for _ in range(50000)], trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                            pad_token="<pad>", unk_token="<unk>").save_pretrained(out)


def main() -> int:
    args = sys.argv[1:]
    torchscript = "--torchscript" in args
    args = [a for a in args if a != "--torchscript"]
    arch = "llama"
    if "--arch" in args:
        i = args.index("--arch")
        arch = args[i + 1]
        del args[i : i + 2]
    if len(args) != 1 or arch not in ARCHS:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(args[0])
    config_cls, model_cls, changes = ARCHS[arch]
    config = dict(CONFIG, **changes)
    hf = out / "hf"
    rng = gf.seed_everything(0)
    torch.manual_seed(0)
    model = model_cls(config_cls(**config)).to(torch.float32).eval()
    model.save_pretrained(hf)
    tokenizer(hf)
    gf.set_attn_impl(model.config)
    (out / "torch").mkdir(parents=True, exist_ok=True)
    shape = (config["num_hidden_layers"], config["num_key_value_heads"],
             config["hidden_size"] // config["num_attention_heads"], config["vocab_size"])
    gf.export_causal_lm_with_past(
        f"bench_{arch}", out / "torch", model, *shape, with_position_ids=True, rng=rng,
        external_data=True,
    )
    if torchscript:
        gf.export_causal_lm_with_past(
            f"bench_{arch}_torchscript", out / "torchscript", model, *shape,
            with_position_ids=True, rng=rng, external_data=True, prefer_dynamo=False,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
