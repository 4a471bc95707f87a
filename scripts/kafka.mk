# kafka.mk: a local Apache Kafka 4 broker for the tests that need a real one.
# Included by the top-level Makefile. The broker listens on 127.0.0.1:19092
# (KAFKA_PORT) and keeps its jars, data and log in .kafka/ (git-ignored); Java 17+
# is needed, and Maven the first time, to fetch the jars.
#
#   make kafka-up      start it, or check that it answers when already running
#   make kafka-down    stop it and keep the data (a later kafka-up resumes)
#   make kafka-clean   stop it and remove the data and logs (the jars stay cached)

KAFKA_MK_DIR := $(dir $(lastword $(MAKEFILE_LIST)))

.PHONY: kafka-up kafka-down kafka-clean

kafka-up:
	@bash $(KAFKA_MK_DIR)kafka-up.sh

kafka-down:
	@bash $(KAFKA_MK_DIR)kafka-down.sh

kafka-clean:
	@bash $(KAFKA_MK_DIR)kafka-down.sh --clean
