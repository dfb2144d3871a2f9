"""The metrics stage: harvest a job's metrics, accounting, utilisation and cost; publish them."""
