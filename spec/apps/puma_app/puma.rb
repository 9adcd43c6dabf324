# frozen_string_literal: true

# puma -C puma.rb config.ru, PORT set: the cluster mode a Rails app runs in
# production, with the app loaded in the master before it forks.
workers 2
threads 1, 4
preload_app!
environment "production"
bind "tcp://127.0.0.1:#{ENV.fetch('PORT')}"
