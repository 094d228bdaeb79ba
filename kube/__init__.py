"""The one adapter over the official `kubernetes` client; activities and watchers talk to Kubernetes only here."""
