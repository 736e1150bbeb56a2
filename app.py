"""SwitchSD Studio.  python app.py  ->  http://127.0.0.1:7860 (offline SmolLM2-135M-Instruct by default)."""
from __future__ import annotations

import argparse

from starlette.middleware import Middleware

from app.early_js import EarlyScript
from app.guard import GUARD, QUEUE_MAX
from app.live import LiveRoute
from app.render import CSS, HEAD_JS
from app.resources import Resources, settle_heap
from app.studio import build_demo, quiet_queue
from switchsd.models.forward import FORWARDS

MAX_UPLOAD = "1mb"          # uploads are probe files (the shipped one is ~10 KB); switchsd/core/probe.py checks too


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="a .gguf file, a local folder or an HF id (default: the offline "
                    "SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--eagle", default="auto", help="EAGLE3 head folder or HF id (auto: the shipped head)")
    ap.add_argument("--draft", default=None, help="SPS draft model (HF id or folder)")
    ap.add_argument("--probe", default="auto", help="copy-intent probe (.safetensors; auto: the shipped one)")
    ap.add_argument("--forward", choices=FORWARDS, default="auto",
                    help="the target's forward: auto (lean where supported), lean, hf (transformers' own)")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads for the model's forwards and the Probe lab's training (default: one per core)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--share", action="store_true",
                    help="create a public Gradio link: anyone with it can use this machine's model (add --auth)")
    ap.add_argument("--auth", default=None, metavar="USER:PASS", help="require this login (Gradio's auth)")
    args = ap.parse_args(argv)
    auth = None
    if args.auth is not None:
        user, sep, password = args.auth.partition(":")
        if not sep or not user or not password:
            ap.error("--auth takes USER:PASS")
        auth = (user, password)
    if args.threads is not None:
        if args.threads < 1:
            ap.error("--threads takes a positive number")
        import torch
        torch.set_num_threads(args.threads)
    demo = build_demo(Resources(model_name=args.model, dtype=args.dtype, device=args.device, eagle=args.eagle,
                                draft=args.draft, probe=args.probe, forward=args.forward))
    # every run goes through the device queue (no direct REST route past it), which holds at most
    # QUEUE_MAX runs and GUARD.per_session of any one browser session (app/guard.py)
    demo = quiet_queue(demo.queue(default_concurrency_limit=1, api_open=False, max_size=QUEUE_MAX))
    settle_heap()
    GUARD.install(demo)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, auth=auth, head=HEAD_JS, css=CSS,
                max_file_size=MAX_UPLOAD,
                app_kwargs={"middleware": [Middleware(EarlyScript), Middleware(LiveRoute)]})  # app/early_js.py,
    # app/live.py: why


if __name__ == "__main__":
    main()
