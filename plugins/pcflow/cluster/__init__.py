"""The cluster stage: a Slurm cluster to train on, from AWS ParallelCluster (through the `pcluster`
CLI in its own virtual environment) or an existing ("static") Slurm cluster reached over SSH.

Modules: `spec` (the validated inputs), `config` (rendering the ParallelCluster YAML), `info`
(`ClusterInfo`, the XCom shape every provider returns), `pcluster` (`ParallelClusterHook`, the CLI),
`parallelcluster` / `static` (the two providers), `providers` (choice by name), `triggers`,
`operators`, `teardown` (the teardown-loop handler for ParallelCluster stacks).
"""
