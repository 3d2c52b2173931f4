// Package rabbitmq is what stagehand's proof rigs need to run against RabbitMQ: a throwaway node started from the
// local rabbitmq-server (Start: its own directory, node name, ports and epmd, as any user, root included; Kill and
// Restart for a broker crash), a Watermill Publisher that returns only once the broker confirmed each message,
// a reconnecting wrapper around watermill-amqp's Subscriber, and the relay's classification of AMQP errors
// (Unavailable). examples/rabbitmq shows the same wiring with watermill-amqp alone.
package rabbitmq
