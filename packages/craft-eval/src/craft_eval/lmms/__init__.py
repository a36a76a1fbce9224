"""craft-eval's lmms-eval plugin: every backbone's lmms-eval model class with a compressor
in front of its language model.

    pip install craft-eval[lmms]
    lmms-eval --model craft_qwen2_5_vl \
        --model_args pretrained=DIR,method=craft,checkpoint=CKPT,ratio=8 --tasks videomme

lmms-eval finds the models through the entry-point group `lmms_eval.models`
(`craft_eval.lmms.plugin:manifests`). Importing this package does not import lmms-eval;
`craft_eval.lmms.models` does.
"""

from __future__ import annotations

from craft_eval.lmms.plugin import BACKBONES, manifests

__all__ = ["BACKBONES", "manifests"]
