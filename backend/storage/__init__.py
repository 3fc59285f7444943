"""The bucket: a run's folder as a local folder or a Hub Storage Bucket (`store`, `hub_store`), and the incremental
readers of its write-once fragments (`observers`)."""
