"""SwitchSD Studio.  python app.py  ->  http://127.0.0.1:7860 (offline SmolLM2-135M-Instruct by default)."""
from __future__ import annotations

import argparse

from starlette.middleware import Middleware

from app.early_js import EarlyScript
from app.live import LiveRoute
from app.render import CSS, HEAD_JS
from app.resources import Resources
from app.studio import build_demo, quiet_queue


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None, help="HF id or local folder (default: offline SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--eagle", default="auto", help="EAGLE3 head folder or HF id (auto: the shipped head)")
    ap.add_argument("--draft", default=None, help="SPS draft model (HF id or folder)")
    ap.add_argument("--probe", default="auto", help="copy-intent probe (.safetensors; auto: the shipped one)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default: localhost only)")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--share", action="store_true", help="create a public Gradio link")
    args = ap.parse_args(argv)
    demo = build_demo(Resources(model_name=args.model, dtype=args.dtype, device=args.device, eagle=args.eagle,
                                draft=args.draft, probe=args.probe))
    demo = quiet_queue(demo.queue(default_concurrency_limit=1))
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, head=HEAD_JS, css=CSS,
                app_kwargs={"middleware": [Middleware(EarlyScript), Middleware(LiveRoute)]})  # app/early_js.py,
    # app/live.py: why


if __name__ == "__main__":
    main()
