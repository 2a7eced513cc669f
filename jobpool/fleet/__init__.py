"""The fleet: which Docker daemons there are, who each one is, and what each one holds.

daemonid.py says which daemon a container lives on; daemonmark.py whether a daemon is the only one with its
identity; gone.py records daemons an operator declared gone for good; inventory.py is the format of a daemon's
published inventory, and strays.py the rule for the running containers no row accounts for (published in it).
The workers publish inventories (jobpool/workers/inventory.py) and the supervisor judges from them
(jobpool/supervisor/remote.py).
"""
