"""The PyFlink shell: the job's wiring (pipeline.py), the operator that runs any stage core (operators.py), the
sinks (store_sink.py, kafka_connector.py), metrics and the state backend. No decision lives here."""
