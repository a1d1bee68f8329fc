"""The RocketMQ 5 gRPC door: `apache.rocketmq.v2.MessagingService` for the official clients.

A third door into the same house as the REST API and the console: every RPC translates its
protocol's input and errors and calls the same `apps.broker.services` functions."""
