"""What users compute from samples: predictions, calibration, distances, diagnostics, references and exact laws."""
