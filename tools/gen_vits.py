#!/usr/bin/env python3
"""Exports a ViT-S/14 (the DINOv2-small configuration: 12 layers, 384 wide, 6 heads, 22 M
parameters) with seeded random weights through `torch.onnx` (opset 17), for timing `--auto` on
a model of real size:

    python tools/gen_vits.py OUT.onnx

Needs torch and transformers (tools/requirements-fixtures.txt).
"""

import sys

import torch
import transformers


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "vits.onnx"
    cfg = transformers.Dinov2Config(
        hidden_size=384,
        num_hidden_layers=12,
        num_attention_heads=6,
        intermediate_size=1536,
        patch_size=14,
        image_size=224,
    )
    torch.manual_seed(0)
    model = transformers.Dinov2Model(cfg).eval()
    x = torch.randn(1, 3, 224, 224)
    torch.onnx.export(
        model,
        (x,),
        out,
        input_names=["pixel_values"],
        output_names=["last_hidden_state", "pooler_output"],
        opset_version=17,
        dynamo=False,
    )
    print(f"{out}: {sum(p.numel() for p in model.parameters())} parameters")


if __name__ == "__main__":
    main()
