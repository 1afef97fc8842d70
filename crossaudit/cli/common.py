"""What every ``crossaudit`` command shares: its exit codes."""

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2  # success; invalid input or failed checks; usage or internal error
