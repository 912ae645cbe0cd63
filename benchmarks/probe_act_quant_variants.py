"""Which arithmetic variants of the benchmark's activation quantizer can be told apart at all?

Each variant rewrites one float32 step of ``refimpl.nvfp4.quantize_activations`` in a way a
kernel author might (dividing by 6 instead of multiplying by fl32(1/6), reassociating,
``2688.0 / t`` in torch, ``global_encode / s`` instead of ``1 / (s * global_decode)``,
dividing x instead of multiplying by the encode scale, ties rounded up), and counts the
e2m1 codes and e4m3 scales that differ from the oracle's on benchmark-like activations
(bf16 randn of random magnitudes). Run on the CPU:

    PYTHONPATH=src python3 benchmarks/probe_act_quant_variants.py
"""
import torch
from fuseval.refimpl import nvfp4
from fuseval.refimpl.nvfp4 import encode_e4m3fn, decode_e4m3fn, E2M1_THRESHOLDS
F=torch.float32
def quant(x, variant):
    xf=x.float(); fmax=torch.tensor(torch.finfo(F).max)
    amax=xf.abs().max()
    ge = (2688.0/amax) if variant=="rtruediv_2688" else torch.tensor(2688.0)/amax
    ge=torch.minimum(ge,fmax); gd=torch.tensor(1.0)/ge
    b=xf.reshape(xf.shape[0],-1,16); bmax=b.abs().amax(-1)
    if variant=="div6": s=(bmax/torch.tensor(6.0))*ge
    elif variant=="reassoc": s=bmax*(ge*torch.tensor(1/6.0,dtype=F))
    else: s=(bmax*torch.tensor(1/6.0,dtype=F))*ge
    s=s.clamp(-448,448); sb=encode_e4m3fn(s); sd=decode_e4m3fn(sb,F)
    if variant=="ge_over_s": enc=torch.minimum(ge/sd, fmax)
    else: enc=torch.minimum(torch.tensor(1.0)/(sd*gd), fmax)
    if variant=="divide": y=(b/(sd*gd)[...,None]).clamp(-6,6)
    else: y=(b*enc[...,None]).clamp(-6,6)
    a=y.abs(); mag=torch.zeros(y.shape,dtype=torch.uint8)
    for bd,up in E2M1_THRESHOLDS:
        if variant=="ties_up": up=True
        mag+=(a>=bd if up else a>bd).to(torch.uint8)
    codes=mag|((y<0).to(torch.uint8)<<3)
    return codes.reshape(xf.shape), sb
torch.manual_seed(0)
x=torch.randn(2048,4096).to(torch.bfloat16)
ref=nvfp4.quantize_activations(x)
base=quant(x,"base")
assert torch.equal(base[0],ref.codes) and torch.equal(base[1],ref.scales)
for v in ["div6","reassoc","rtruediv_2688","ge_over_s","divide","ties_up"]:
    c,s=quant(x,v)
    xh=nvfp4.ActivationQuant(c,s,ref.global_decode,ref.global_encode).dequantize()
    d=(xh-ref.dequantize()).abs()
    print(f"{v:14s} codes differ {(c!=ref.codes).sum().item():8d}/{c.numel()}  scales differ {(s!=ref.scales).sum().item():6d}/{s.numel()}  max|dx_hat| {d.max().item():.3g}")
print("--- over 40 draws of 256x4096 bf16 randn (draws with any difference / total code diffs)")
from collections import Counter
hits=Counter(); tot=Counter()
for seed in range(40):
    torch.manual_seed(100+seed)
    x=(torch.randn(256,4096)*torch.exp(torch.randn(()))).to(torch.bfloat16)
    ref=nvfp4.quantize_activations(x)
    for v in ["div6","reassoc","rtruediv_2688","ge_over_s","divide","ties_up"]:
        c,s=quant(x,v); n=(c!=ref.codes).sum().item()+(s!=ref.scales).sum().item()
        hits[v]+= n>0; tot[v]+=n
for v in hits: print(f"{v:14s} draws with a difference {hits[v]}/40, code+scale differences {tot[v]}")
