"""A generic greedy decode loop over ONNX Runtime for models with a KV cache at the interface.

Every ``present*`` output is fed back to the ``past*`` input of the same name
(``present.0.key`` -> ``past_key_values.0.key``, ``present.0.key_scale`` ->
``past_key_values.0.key_scale``) as an ``OrtValue``, whatever its element type (float, INT8,
FP8, INT4), so the loop needs no knowledge of how a cache is quantized.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort

# ONNX element types of the cache tensors a session may take.
_ONNX_TYPES = {
    "tensor(float)": (1, np.float32),
    "tensor(float16)": (10, np.float16),
    "tensor(int8)": (3, np.int8),
    "tensor(float8e4m3fn)": (17, np.uint8),
    "tensor(int4)": (22, np.int8),
}


def past_of(present: str, inputs: Sequence[str]) -> str:
    """The input a ``present*`` output continues."""
    for old, new in (("present", "past_key_values"), ("present", "past")):
        name = present.replace(old, new, 1)
        if name in inputs:
            return name
    raise KeyError(f"no past input continues output {present!r}")


def empty_cache(sess: ort.InferenceSession, batch: int) -> dict[str, ort.OrtValue]:
    """Zero-token caches: dim 0 is the batch, the other symbolic dims (tokens) are 0."""
    out = {}
    for i in sess.get_inputs():
        if "past" not in i.name:
            continue
        shape = [batch if k == 0 else (d if isinstance(d, int) else 0) for k, d in enumerate(i.shape)]
        onnx_type, np_type = _ONNX_TYPES[i.type]
        out[i.name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            np.zeros(shape, np_type), onnx_type
        )
    return out


def greedy(
    path: str,
    prefill: dict[str, np.ndarray | ort.OrtValue],
    steps: int,
    embed: Callable[[np.ndarray], dict[str, np.ndarray | ort.OrtValue]],
    forced: Sequence[int] | None = None,
) -> tuple[list[int], list[np.ndarray]]:
    """Runs ``prefill`` (the first step's inputs besides the cache, mask and positions), then
    ``steps - 1`` one-token steps whose inputs ``embed(next_token)`` gives; the next token is the
    argmax of the last logits, or ``forced[i]`` (teacher forcing, to compare two models on one
    token history). Returns the tokens chosen and the last-position logits of every step."""
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]
    feeds = dict(prefill)
    batch = feeds["input_ids"].shape[0]
    cache = empty_cache(sess, batch)
    total = 0
    tokens: list[int] = []
    logits: list[np.ndarray] = []
    for step in range(steps):
        seq = feeds["input_ids"].shape[1]
        ort_feeds = dict(cache)
        for k, v in feeds.items():
            ort_feeds[k] = v if isinstance(v, ort.OrtValue) else ort.OrtValue.ortvalue_from_numpy(v)
        if "attention_mask" in names:
            mask = np.ones((batch, total + seq), np.int64)
            ort_feeds["attention_mask"] = ort.OrtValue.ortvalue_from_numpy(mask)
        if "position_ids" in names:
            pos = np.arange(total, total + seq, dtype=np.int64)[None].repeat(batch, 0)
            ort_feeds["position_ids"] = ort.OrtValue.ortvalue_from_numpy(pos)
        result = dict(zip(outputs, sess.run_with_ort_values(outputs, ort_feeds)))
        last = result["logits"].numpy()[:, -1, :]
        logits.append(last)
        for o in outputs:
            if o.startswith("present"):
                cache[past_of(o, names)] = result[o]
        total += seq
        token = int(last[0].argmax()) if forced is None else int(forced[step])
        tokens.append(token)
        feeds = embed(np.full((batch, 1), token, np.int64))
    return tokens, logits


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def with_image_input(model, hidden: int):
    """A decoder that takes ``image_embeds [batch, images, hidden]`` besides ``input_ids``, as
    LLaVA-style models do: the first ``images`` positions of ``input_ids`` are placeholders whose
    token embeddings are replaced by the image features (none in the one-token steps).

    Rewrites the ``Gather`` of the token-embedding table that reads ``input_ids``."""
    from onnx import TensorProto, helper

    g = model.graph
    tables = {i.name for i in g.initializer if len(i.dims) == 2 and i.dims[1] == hidden}
    gather = next(
        n for n in g.node
        if n.op_type == "Gather" and n.input[0] in tables and n.input[1] == "input_ids"
    )
    emb = gather.output[0]
    text, merged = emb + "_text", emb + "_with_image"
    for n in g.node:
        for i, name in enumerate(n.input):
            if name == emb:
                n.input[i] = merged
    for o in g.output:
        assert o.name != emb
    g.input.append(
        helper.make_tensor_value_info("image_embeds", TensorProto.FLOAT, ["batch", "images", hidden])
    )
    g.initializer.extend([
        helper.make_tensor("image_embeds_axis", TensorProto.INT64, [1], [1]),
        helper.make_tensor("image_embeds_end", TensorProto.INT64, [1], [2**62]),
    ])
    nodes = [
        helper.make_node("Shape", ["image_embeds"], ["image_embeds_shape"], start=1, end=2),
        helper.make_node(
            "Slice",
            [emb, "image_embeds_shape", "image_embeds_end", "image_embeds_axis"],
            [text],
        ),
        helper.make_node("Concat", ["image_embeds", text], [merged], axis=1),
    ]
    at = list(g.node).index(gather) + 1
    for k, n in enumerate(nodes):
        g.node.insert(at + k, n)
    return model
