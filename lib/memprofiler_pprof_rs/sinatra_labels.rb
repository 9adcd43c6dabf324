# frozen_string_literal: true

module MemprofilerPprof
  # Sinatra extension that labels the work of each route with its pattern
  # (see Labels), as Sinatra names it: `route: "GET /users/:id"`.
  #
  #   class App < Sinatra::Base
  #     register MemprofilerPprof::SinatraLabels
  #   end
  #
  # Sinatra knows the route only once it has matched one, so the label
  # covers the route's block (and what it renders), not the filters and
  # middleware around it: `use MemprofilerPprof::RackLabels` labels the
  # whole request by its path. Patterns come from the app's code, so they
  # are bounded.
  module SinatraLabels
    def self.registered(app)
      app.prepend(RouteLabel)
    end

    # Wraps Sinatra's route_eval (Sinatra 2 and 3), which runs a matched
    # route's block once env["sinatra.route"] names it.
    module RouteLabel
      private

      def route_eval(&block)
        route = env["sinatra.route"]
        return super unless route.is_a?(String)

        Labels.with_if_valid({ route: route }) { super(&block) }
      end
    end
  end
end
