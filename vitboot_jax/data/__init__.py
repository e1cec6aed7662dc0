"""Data, one job per module, named by where it runs:

- read_folders, read_npz: image folders and `.npz` arrays read without TensorFlow; splits: what
  every source shares (sizes, the paper's subsets, checks); prepare: data on disk before a run.
- tfdata_sources, tfdata_pipeline, tfdata_augment, tfdata_undecodable: the host pipeline in
  tf.data (the sources as datasets, the batches, the per-example ops, the undecodable files).
- device_pipeline: the dataset held on the devices, batches made inside the step;
  step_preprocess: the in-step finish both pipelines share (resize, normalise).
- loop_feed: what the training loop feeds its jitted step; workdir_record: the data.json record.
"""
