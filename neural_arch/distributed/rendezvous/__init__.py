"""How the ranks of a job find and trust each other before any collective runs.

``env`` reads rank, world size and the master's address from the environment (the launchers'
variable families are in ``families``, SLURM node lists in ``hostlist``, and ``report`` prints
the choice for ``python -m neural_arch.distributed.env``); ``job`` names the job a rank belongs
to; ``store`` is the small TCP key-value store rank 0 serves (its wire format in
``store_protocol``, its server in ``store_server``, the ranks' arrival in ``arrival``);
``waiting`` bounds the rendezvous and says what a rank waits for; ``auth`` the job secret and
the handshake every connection starts with; and ``gate`` the door of a listening port, where
connections authenticate before anyone serves them.

Nothing is imported here, so process groups can read the environment without loading the store.
"""
