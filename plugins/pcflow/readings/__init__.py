"""What a running job writes, read without I/O: its metrics lines (`jsonlines`), grouped into series
(`series`); its utilisation samples, from the sampler the batch wrapper starts on each node (`sampler`,
`utilisation`); and the early-stopping rule over those metrics with the stop record it leaves
(`stopping`).

It imports nothing else of pcflow, so the Slurm stage's wait (which applies the rule and uploads the
sampler) and the metrics stage's harvest (which reads what the job wrote) both build on it: the metrics
stage sits above the Slurm stage, and the Slurm stage imports no `metrics` module.
"""
