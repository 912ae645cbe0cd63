"""One warm call of op B's fused kernel and of op A's attention at 8192 tokens, for Nsight
Compute (the kernels to read are selected by ncu's --kernel-name):

    ncu --kernel-name regex:"gluon|attention" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \\
        --section WarpStateStats python3 benchmarks/ncu_targets.py

Each target runs twice before the profiled call (compilation, caches)."""
import os

import torch

os.environ.setdefault("FUSEVAL_NO_GRAPHS", "1")
from fuseval.operators import load  # noqa: E402
from fuseval.inputs import generate_inputs  # noqa: E402
from fuseval.operators.nvfp4_qkv_rope import fast as B  # noqa: E402
from fuseval.operators.qwen2vl_decoder_layer import fast as A  # noqa: E402

dev = torch.device("cuda")
ib = generate_inputs(load("nvfp4_qkv_rope", "seed"), {"seq_len": 8192, "batch_size": 1}, seed=0, device=dev)
ia = generate_inputs(load("qwen2vl_decoder_layer", "seed"), {"seq_len": 8192, "kv_seq_len": 8192, "batch_size": 1},
                     seed=0, device=dev)
sh = A.shape_of(ia)
plan = A.plan_for(sh, dev)
qk = torch.randn(sh.M, sh.QD + sh.KD, device=dev)
vt = torch.randn(sh.B, sh.Hkv, sh.D, sh.S_pad, device=dev)
attn = torch.empty(sh.M, sh.QD, device=dev)
for _ in range(3):
    B.forward(*ib)
    A.launch_attention(qk, vt, attn, sh, plan)
torch.cuda.synchronize()
print("done")
