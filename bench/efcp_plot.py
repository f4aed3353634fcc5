#!/usr/bin/python3
"""Plots the T1 loss curves written by bench/efcp_t1 (--csv) as a PNG, one panel per CSV.

  /usr/bin/python3 bench/efcp_plot.py docs/efcp_t1.png /tmp/efcp2_t1_d16.csv /tmp/efcp2_t1.csv
"""
import collections
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def panel(ax, src):
    curves = collections.OrderedDict()
    target = lstar = None
    with open(src) as f:
        for row in csv.reader(f):
            if row[0] == "method":
                continue
            if row[0] == "#target":
                target, lstar = float(row[1]), float(row[2])
                continue
            curves.setdefault(row[0], ([], []))
            curves[row[0]][0].append(int(row[1]))
            curves[row[0]][1].append(float(row[2]))
    # Excess loss over L* on a log scale: near the target the curves differ by a few 1e-3,
    # invisible on a linear axis that also has to show L0.
    for i, (name, (steps, loss)) in enumerate(curves.items()):
        style = "--" if "noEF" in name else (":" if "Oracle" in name else "-")
        excess = [max(v - lstar, 1e-4) for v in loss]
        ax.plot(steps, excess, style, label=name, linewidth=1.2, color=plt.cm.tab20(i % 20))
    if target is not None:
        ax.axhline(target - lstar, color="k", linestyle="-.", linewidth=1,
                   label="target: 5% (L0-L*)")
    ax.set_yscale("log")
    ax.set_ylim(1e-3 if lstar is not None else None, 1.0)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss - L* (full data)")
    ax.set_title(src.split("/")[-1], fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3)


def main(dst, sources):
    fig, axes = plt.subplots(1, len(sources), figsize=(7.5 * len(sources), 5.5), squeeze=False)
    for ax, src in zip(axes[0], sources):
        panel(ax, src)
    fig.suptitle("T1: logistic regression, rotated ill-conditioned features (seed 0, best grid point of each)")
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
