"""A tiny saved TabGPT and a real ``python -m neural_arch.serve`` process for the serve tests
(``benchmarks/bench_serve.py`` starts its servers and saves its model with them too)."""
from __future__ import annotations

import http.client
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
from typing import Any, Optional, Tuple

import numpy as np

from neural_arch.core import manual_seed, no_grad
from neural_arch.data.tabular import TabularDataset, TabularPreprocessor, load_bundled
from neural_arch.models.tabgpt import TabGPTConfig, TabGPTForSequenceClassification
from neural_arch.optim import AdamW

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 15.0


def table_of(name: str) -> Tuple[dict, str]:
    """A bundled table; wine gets a categorical column too, so both kinds are served."""
    table, target = load_bundled(name)
    table = dict(table)
    if name == "wine":
        rows = len(table[target])
        table["cellar"] = np.array([("north", "south", "east")[i % 3] for i in range(rows)],
                                   dtype=object)
    return table, target


def train_and_save(folder: str, table: dict, target: str, steps: int, lr: float,
                   **model_config: Any):
    """A TabGPT classifier of ``model_config`` trained ``steps`` steps of 32 rows on ``table``
    (from seed 0), saved to ``folder`` with its preprocessor; (model in eval mode,
    preprocessor, the table's encoded rows). The serve tests and ``bench_serve`` serve it."""
    manual_seed(0)
    preprocessor = TabularPreprocessor(target=target)
    preprocessor.fit(table)
    rows = TabularDataset(table, preprocessor)
    model = TabGPTForSequenceClassification(
        TabGPTConfig(**preprocessor.model_config(), **model_config))
    optimizer = AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        batch = slice(32 * step, 32 * (step + 1))
        loss = model(rows.x_num[batch], rows.x_cat[batch], labels=rows.y[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(folder, preprocessor=preprocessor)
    model.eval()
    return model, preprocessor, rows


def save_tiny_model(folder: str, name: str = "wine", steps: int = 2):
    """A TabGPT trained ``steps`` steps on the bundled table, saved with its preprocessor;
    returns (model in eval mode, preprocessor, table, target)."""
    table, target = table_of(name)
    model, preprocessor, _ = train_and_save(folder, table, target, steps, lr=1e-2, d_token=8,
                                            n_layers=1, n_heads=2, attention_dropout=0.0,
                                            ffn_dropout=0.0)
    return model, preprocessor, table, target


def in_process_scores(model, preprocessor, table: dict) -> np.ndarray:
    """The model's own scores for these rows, all in one call (the reference)."""
    encoded = preprocessor.transform(table)
    with no_grad():
        return model(encoded.x_num, encoded.x_cat).logits.numpy().astype(np.float64)


def rows_of(table: dict, target: str, indices) -> list:
    """Rows as JSON objects keyed by column name (the target left out)."""
    names = [name for name in table if name != target]
    return [{name: table[name][i].item() if hasattr(table[name][i], "item") else table[name][i]
             for name in names} for i in indices]


class Server:
    """``python -m neural_arch.serve --model FOLDER --port 0 ...`` as a real process, once it
    listens (within ``start_timeout`` seconds)."""

    def __init__(self, folder: str, *options: str,
                 start_timeout: float = START_TIMEOUT_S) -> None:
        command = [sys.executable, "-m", "neural_arch.serve", "--model", folder, "--port", "0",
                   *options]
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        self.port = self._read_port(start_timeout)

    def _read_port(self, start_timeout: float) -> int:
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + start_timeout
        try:
            while time.monotonic() < deadline:
                if selector.select(timeout=0.2):
                    line = self.process.stdout.readline()
                    match = re.fullmatch(r"listening on http://.+:(\d+)\n", line)
                    if match:
                        return int(match.group(1))
                    if not line:
                        break
        finally:
            selector.close()
        self.kill()
        raise RuntimeError(f"the server printed no port within {start_timeout} s; stderr:\n"
                           f"{self.process.stderr.read()[-3000:]}")

    def request(self, method: str, path: str, body: Any = None,
                timeout: float = 10.0) -> Tuple[int, Any]:
        """(status, decoded JSON) of one request; ``body`` bytes as they are, else as JSON."""
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body,
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            return response.status, json.loads(response.read())
        finally:
            connection.close()

    def stop(self, sig: int = signal.SIGTERM) -> Tuple[int, str]:
        """Signal the server; its exit status and stderr once it has stopped."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            _, stderr = self.process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"the server did not stop within {STOP_TIMEOUT_S} s of "
                               f"signal {sig}") from None
        return self.process.returncode, stderr

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=STOP_TIMEOUT_S)


def run_command(*arguments: str, timeout: float = 20.0) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "neural_arch.serve", *arguments],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def close_server(server: Optional[Server]) -> None:
    if server is not None and server.process.poll() is None:
        server.kill()
