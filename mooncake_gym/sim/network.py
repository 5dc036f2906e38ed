"""KV transfers over the nodes' NICs: each NIC's bandwidth shared by the transfers it carries.

Each node (a prefill or a decode instance: one 8-GPU node, Mooncake v3 §2) has one NIC of
``bandwidth`` bytes/s each way (the cost model's RDMA figure, 800 Gbps per node: FAST'25 Table 1).
A transfer from node a to node b runs at ``min(bandwidth / n_out[a], bandwidth / n_in[b])``: its
sender's NIC shares its bandwidth equally among the transfers it sends, the receiver's among those
it receives, and a transfer gets the smaller of its two shares (equal sharing per NIC, recomputed
whenever a transfer starts or ends; not max-min water-filling: a share a transfer cannot use on its
other NIC is not given to the others). Without contention a transfer takes bytes / bandwidth.

Event-driven: :attr:`next_s` is when the next transfer drains; :meth:`drained` advances to that time
and returns the payloads of the transfers done; :attr:`version` changes with every change of rates.
"""

from __future__ import annotations

import math


class Network:
    """The NICs of ``n_nodes`` nodes, ``bandwidth`` bytes/s each (see the module docstring)."""

    __slots__ = ("bandwidth", "flows", "n_out", "n_in", "t", "next_s", "version", "bytes_sent", "transfers")

    def __init__(self, n_nodes: int, bandwidth: float):
        if not (isinstance(n_nodes, int) and n_nodes >= 1):
            raise ValueError(f"n_nodes: expected an integer >= 1, got {n_nodes!r}")
        if not (bandwidth > 0 and math.isfinite(bandwidth)):
            raise ValueError(f"bandwidth: expected a finite number of bytes/s > 0, got {bandwidth!r}")
        self.bandwidth = float(bandwidth)
        # per transfer: [sender, receiver, bytes left at t, rate, drain time at that rate, payload]
        self.flows: list[list] = []
        self.n_out = [0] * n_nodes
        self.n_in = [0] * n_nodes
        self.t = 0.0
        self.next_s = math.inf
        self.version = 0
        self.bytes_sent = 0.0
        self.transfers = 0

    def _progress(self, t: float) -> None:
        dt = t - self.t
        if dt > 0.0:
            for f in self.flows:
                f[2] -= f[3] * dt
        self.t = t

    def _rates(self) -> None:
        b, n_out, n_in, t = self.bandwidth, self.n_out, self.n_in, self.t
        nxt = math.inf
        for f in self.flows:
            k = n_out[f[0]]
            m = n_in[f[1]]
            rate = b / (k if k > m else m)
            f[3] = rate
            f[4] = end = t + f[2] / rate
            if end < nxt:
                nxt = end
        self.next_s = nxt
        self.version += 1

    def add(self, t: float, sender: int, receiver: int, nbytes: float, payload) -> None:
        """Start a transfer of ``nbytes`` from node ``sender`` to node ``receiver`` at ``t`` (no
        earlier than the last event)."""
        self._progress(t)
        self.flows.append([sender, receiver, float(nbytes), 0.0, 0.0, payload])
        self.n_out[sender] += 1
        self.n_in[receiver] += 1
        self.bytes_sent += nbytes
        self.transfers += 1
        self._rates()

    def drained(self, t: float) -> list:
        """Advance to ``t`` (:attr:`next_s`, or earlier: nothing drains) and return the payloads
        of the transfers done by then, in the order they started."""
        done = []
        keep = []
        for f in self.flows:
            if f[4] <= t:
                done.append(f[5])
                self.n_out[f[0]] -= 1
                self.n_in[f[1]] -= 1
            else:
                keep.append(f)
        if not done:
            return done
        self._progress(t)
        self.flows = keep
        self._rates()
        return done

    def busy(self, node: int) -> int:
        """Transfers node ``node`` sends or receives now."""
        return self.n_out[node] + self.n_in[node]
