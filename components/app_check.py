"""The GPU check with the app's part: ``python -m components.app_check [the GPU check's options]``.

``tr_core.bench.gpu_check`` checks the decoders, the kernels and the dtype rule on a device and
imports nothing of the app.  This adds the app on that device: started on a free local port with
the check's model, three Steps through ``gradio_client``, each identical to greedy and each a new
step.  Where Gradio is not installed (a bare GPU host) the part is skipped and says so.
"""
from __future__ import annotations

import socket
import sys


def check_app(lm, prompt: str) -> dict:
    """The app on ``lm``'s device: launched, three Steps through gradio_client (skipped without Gradio)."""
    try:
        import gradio  # noqa: F401
        from gradio_client import Client
    except ImportError:
        return {"skipped": "gradio is not installed"}
    from app import build_app, serve
    from components.model_hub import ModelHub

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo = build_app(ModelHub(loaded={"embedded": lm}), cap=64)
    serve(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False, ssl_verify=False)  # loopback: no certificates to load
        args = (prompt, "embedded", "auto", 8, 24, True, True, "Token Recycling (TR)")
        counters = [client.predict(*args, api_name="/do_step")[4] for _ in range(3)]
        return {"steps": 3, "identical": all("identical to greedy" in c for c in counters),
                "distinct_steps": len(set(counters))}
    finally:
        demo.close()


def main(argv: list[str] | None = None) -> int:
    from tr_core.bench import gpu_check

    return gpu_check.main(argv, parts={"app": check_app})


if __name__ == "__main__":
    sys.exit(main())
