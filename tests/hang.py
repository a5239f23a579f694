"""How long a test waits before it calls something a hang. Far above any slow machine's time (the default suite
took 34 min on a 2-vCPU machine at load 5, where no single wait in it took more than a few minutes): a test
never fails because a machine is slow, only because something stopped making progress."""

HANG_S = 3600
