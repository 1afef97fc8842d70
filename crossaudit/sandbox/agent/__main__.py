"""``python -m crossaudit.sandbox.agent`` runs the agent (the backends run ``agent.py`` directly with ``-I``)."""

from crossaudit.sandbox.agent.agent import main

raise SystemExit(main())
