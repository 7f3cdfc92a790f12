"""docs/img/call-path.png: the path of one OpenAI call through gpulane as a sequence diagram, drawn from this file
(`make plots`).

    .venv/bin/python docs/diagrams/call_path.py [OUT.png]
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).resolve().parents[1] / "img" / "call-path.png"

PARTS = [  # (name, what it is)
    ("client", "openai SDK, curl"),
    ("bridge", "gpulane bridge"),
    ("apiserver", "the GpuJob"),
    ("operator", "gpulane operator"),
    ("backend pod", "on the lane's GPU node"),
]
MESSAGES = [  # (from, to, text)
    ("client", "bridge", "1  POST /v1/chat/completions, X-LlamaSwap-Priority"),
    ("bridge", "apiserver", "2  create a GpuJob: the key's member, tier, capped priority"),
    ("apiserver", "operator", "3  watch: a new job; it waits, scored with the others"),
    ("operator", "backend pod", "4  its turn: reuse the pod, or swap the model"),
    ("operator", "apiserver", "5  status: Running, the pod's endpoint"),
    ("apiserver", "bridge", "6  watch: Running"),
    ("bridge", "backend pod", "7  the call, proxied"),
    ("backend pod", "bridge", "8  the answer, streamed"),
    ("bridge", "client", "9  the answer, streamed on"),
    ("bridge", "apiserver", "10  status: Succeeded; the GPU goes to the next job"),
]
COLOURS = {"client": "#e8eef9", "bridge": "#dfeee2", "apiserver": "#f6ead6", "operator": "#f1e0ef",
           "backend pod": "#e6e6e6"}  # fmt: skip


def draw(out: Path) -> None:
    x = {name: i * 2.6 for i, (name, _what) in enumerate(PARTS)}
    bottom = -len(MESSAGES) - 0.6
    fig, ax = plt.subplots(figsize=(12, 6.2))
    for name, what in PARTS:
        ax.add_patch(plt.Rectangle((x[name] - 1.0, 0.35), 2.0, 0.9, facecolor=COLOURS[name], edgecolor="#555"))
        ax.text(x[name], 0.92, name, ha="center", va="center", fontsize=11, weight="bold")
        ax.text(x[name], 0.58, what, ha="center", va="center", fontsize=8, color="#444")
        ax.plot([x[name], x[name]], [0.35, bottom], color="#999", linestyle="--", linewidth=0.9)
    for row, (start, end, text) in enumerate(MESSAGES, start=1):
        y = -row + 0.1
        ax.annotate("", xy=(x[end], y), xytext=(x[start], y),
                    arrowprops={"arrowstyle": "-|>", "color": "#2f6fdf", "linewidth": 1.4})  # fmt: skip
        left = min(x[start], x[end])
        ax.text(left + 0.12, y + 0.16, text, ha="left", va="bottom", fontsize=8.5, color="#1d3f7a")
    ax.set_xlim(-1.2, x["backend pod"] + 1.2)
    ax.set_ylim(bottom - 0.2, 1.4)
    ax.axis("off")
    ax.set_title("One call through gpulane", fontsize=12)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    draw(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
