package config

// Default returns the configuration of an empty environment. It is the
// starting point of Load and a convenient base for tests.
func Default() Config {
	return Config{
		RedisURL:        DefaultRedisURL,
		DatabaseURL:     DefaultDatabaseURL,
		Addr:            DefaultAddr,
		KeyPrefix:       DefaultKeyPrefix,
		JWTMaxLifetime:  DefaultJWTMaxLifetime,
		HoldDefault:     DefaultHoldDefault,
		HoldMax:         DefaultHoldMax,
		HoldExtensions:  DefaultHoldExtensions,
		LeaseTTL:        DefaultLeaseTTL,
		RejectionTTL:    DefaultRejectionTTL,
		WaitlistMax:     DefaultWaitlistMax,
		MutationRate:    DefaultMutationRate,
		MutationBurst:   DefaultMutationBurst,
		CostLimit:       DefaultCostLimit,
		CostRate:        DefaultCostRate,
		CostBurst:       DefaultCostBurst,
		ShutdownTimeout: DefaultShutdownTimeout,
		LogLevel:        DefaultLogLevel,
		LogFormat:       LogFormatJSON,

		RedisWaitTimeout:        DefaultRedisWaitTimeout,
		ClientAddrHeader:        DefaultClientAddrHeader,
		StreamConnsPerIP:        DefaultStreamConnsPerIP,
		StreamConnsPerPrincipal: DefaultStreamConnsPerPrin,
		StreamSubsPerConn:       DefaultStreamSubsPerConn,
		StreamMessageBytes:      DefaultStreamMessageBytes,
		ResponseMaxBytes:        DefaultResponseMaxBytes,
		StreamInitTimeout:       DefaultStreamInitTimeout,
		StreamPingInterval:      DefaultStreamPingInterval,
		StreamWriteTimeout:      DefaultStreamWriteTimeout,
		LiveInterval:            DefaultLiveInterval,
		APQBytesPerAddr:         DefaultAPQBytesPerAddr,
		BodyTimeout:             DefaultBodyTimeout,
		RequestsPerAddr:         DefaultRequestsPerAddr,
		WebhookTimeout:          DefaultWebhookTimeout,
		WebhookConcurrency:      DefaultWebhookConcurrency,
		WebhookMaxAttempts:      DefaultWebhookMaxAttempts,
		WebhookBackoff:          DefaultWebhookBackoff,
		WebhookBackoffMax:       DefaultWebhookBackoffMax,
		WebhookRetention:        DefaultWebhookRetention,
		MetricsListener:         MetricsPublic,
	}
}
