"""The Ray actor that is one worker of a run: it tells where it runs, then runs the loop.

The loop runs in the actor's main thread (a plain actor, one call at a time), so that the code
it calls may install signal handlers as in any script. Before the loop starts, the actor's
environment gets what ``init_process_group`` reads (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK, the job secret, the backend), so the project's ``Trainer`` joins the job by itself.
"""
from __future__ import annotations

import inspect
import os
import socket
from typing import Any, Callable, Dict, Optional

from . import session


class TrainWorker:
    def describe(self) -> Dict[str, Any]:
        """Where this worker runs: Ray's node, its address, this process."""
        import ray
        from ..distributed.processes import host_identity, process_stat
        stat = process_stat(os.getpid())
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "host": host_identity("pid"), "pid": os.getpid(),
                "start_time": stat[1] if stat else None}

    def free_port(self, address: str) -> int:
        """A port free on ``address`` now: worker 0's store listens there."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            return s.getsockname()[1]

    def run(self, loop: Callable, config: Optional[Dict[str, Any]], env: Dict[str, str],
            context: "session.TrainContext", run_dir: str, next_index: int,
            checkpoint: Optional[str], num_to_keep: Optional[int]) -> int:
        """Run the training loop once; the number of reports it made."""
        os.environ.update(env)
        session.open_session(context, run_dir, next_index, checkpoint, num_to_keep)
        try:
            takes_config = bool(inspect.signature(loop).parameters)
            loop(config if config is not None else {}) if takes_config else loop()
            return session.next_report_index() - next_index
        finally:
            session.close_session()
            from ..distributed.group import world
            if world.is_initialized():
                # The loop ended (or raised) inside its group, as a process that exits without
                # destroy_process_group: tell the peers this rank is gone rather than let them
                # wait for it, as the exit hook does for a script.
                world._destroy(None, abandoned=True)
