"""Data: reading datasets (sources, datasets), the tf.data pipeline (input_pipeline, preprocess),
the on-device pipeline (device_data, device_preprocess) and the feed the loop reads (feeds)."""
