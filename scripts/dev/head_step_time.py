"""What one EAGLE-3 head step costs, part by part, on this CPU: the block (one decoder layer over a 200-position
head cache), the fused-feature `fc`, and the draft-vocabulary LM head in bfloat16, float32 and as int4 groups
(Q4_1-style, `quantize_groups`: ~half bfloat16's time, logits off by up to a few tenths). Milliseconds per call,
one row, after a warm-up. Run it on a quiet machine.

    python scripts/dev/head_step_time.py --head assets/eagle3-smollm2-135m --threads 2
"""
from __future__ import annotations

import argparse
import time

import torch

from switchsd.drafters.eagle3_model import load_eagle3
from switchsd.models.dense import Dense
from switchsd.models.int4 import Int4Linear, quantize_groups
from switchsd.models.loading import load_model


def ms(f, n: int = 200) -> float:
    for _ in range(10):
        f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e3


@torch.inference_mode()
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head", default="assets/eagle3-smollm2-135m")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(dtype="int4", device="cpu")
    head = load_eagle3(args.head, lm.model)
    c = head.config
    H, Vd = c.hidden_size, c.draft_vocab_size
    kvh, hd = c.num_key_value_heads, c.head_dim
    print(f"head {args.head}: hidden {H}, draft vocabulary {Vd}, torch threads {torch.get_num_threads()}")
    for dt in (torch.bfloat16, torch.float32):
        h = head.to(dt)
        x = torch.randn(1, H, dtype=dt)
        g = torch.randn(1, 3 * c.target_hidden_size, dtype=dt)
        emb, hid = torch.randn(1, 1, H, dtype=dt), torch.randn(1, 1, H, dtype=dt)
        pk = torch.randn(1, kvh, 200, hd, dtype=dt)
        pv = torch.randn_like(pk)
        pos = torch.tensor([200])
        dense = Dense(h.lm_head.weight, dt)
        print(f"{str(dt)[6:]:>9}: block {ms(lambda: h.step(emb, hid, pos, pk, pv, None)):.3f} ms, "
              f"fc {ms(lambda: h.fc(g)):.3f}, lm_head {ms(lambda: h.lm_head(x)):.3f} "
              f"(packed Dense {ms(lambda: dense(x)):.3f})")
    codes, scale, zero = quantize_groups(head.lm_head.weight.float())
    ref = head.lm_head.weight.float()
    for dt in (torch.bfloat16, torch.float32):
        q = Int4Linear(codes, scale, zero, dt)
        x = torch.randn(1, H, dtype=dt)
        err = (q(x).float() - torch.nn.functional.linear(x.float(), ref)).abs().max().item()
        print(f"int4 lm_head ({str(dt)[6:]} activations): {ms(lambda: q(x)):.3f} ms, max |logit error| {err:.3f}")


if __name__ == "__main__":
    main()
