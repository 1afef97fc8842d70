"""``python -m sandbox.agent`` runs the agent (the backends run ``agent.py`` directly with ``-I``)."""

from sandbox.agent.agent import main

raise SystemExit(main())
