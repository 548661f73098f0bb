"""A main process that starts DataLoader workers, prints their pids, and is SIGKILLed: its
workers must end on their own."""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from neural_arch.data import DataLoader  # noqa: E402
from worker_datasets import Probe, keep_items  # noqa: E402

loader = DataLoader(Probe(40), batch_size=2, num_workers=2, collate_fn=keep_items)
it = iter(loader)
pids = sorted({item["pid"] for batch in (next(it), next(it)) for item in batch})
print(" ".join(map(str, pids)), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
