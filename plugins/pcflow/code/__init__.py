"""A run's own code: where it comes from (a git commit, a directory the profile allows, a tar in S3),
packed into one content-addressed bundle, uploaded once to the stack's bucket and staged once per
cluster beside the admin's payloads (`pcflow.slurm.payload`, which packs through the same bundle)."""
